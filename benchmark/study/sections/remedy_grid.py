"""Does a remedy trade anything away where lag hurts less: a remedy of presets.REMEDIES at the grid's largest K on
every task (the methods under lag among them have sections of their own at that K), beside PPO and decoupled PPO,
the method it changes. Per task the mean final return of each, and the seed pairings that the remedy and decoupled PPO
win against synchronous PPO and against PPO at that K (clearly behind: at most 2/9 of them won, as the trust-region
section counts), on the seeds every task has; then, where the remedy also ran without lag, the share of PPO's lag
loss it wins back at each K measured two ways: against PPO at K = 1, and against itself at K = 1, so that what it
wins back is lag and not a change to synchronous training."""

import re

import numpy as np

from benchmark.study.estimates import aggregates, lag_won_back
from benchmark.study.presets import LAG_METHODS, REMEDIES, method
from benchmark.study.report import fmt_interval, incomplete_line, interval_cell, titled
from benchmark.study.scores import (common_seeds, completeness, finals, lag_hurt_tasks, on_seeds, pairs_won,
                                    score_matrix)
from benchmark.study.sections.remedies import BASE
from benchmark.study.sections.trust_region import CLEARLY_BEHIND, most_won_when_behind


def section(study):
    lines = []
    for a in REMEDIES:
        lags = [k for k in study.ks if k > 1 and (a, k) in study.raw]
        if lags and a not in LAG_METHODS:
            k = max(lags)
            marker = "remedy_grid_" + re.sub(r"[^a-z0-9]+", "_", a)  # a snippet's name: letters, digits and _
            lines += titled(f"{method(a).name} at K = {k} and without lag", marker, remedy(study, a, k))
    return lines or "no run of a remedy at a lag of the grid"


def seeds_text(seeds):
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def screen_of(study, a, k, tasks):
    """(the seeds of the remedy at K = k that every task has, and "" when its block is complete or else the
    words that say how much of it is in)."""
    done, partial = completeness(study.raw, [a], k, tasks, study.planned)
    runs, planned = partial.get(a, (sum(len(study.raw.get((a, k), {}).get(t, {})) for t in tasks), "?"))
    words = "" if a in done else f"{runs} of the {planned} runs planned at K = {k} are in: a screen, until the rest are"
    return common_seeds(study.raw, (a, k), tasks), words


def remedy(study, a, k):
    tasks, name, base = study.compared, method(a).name, method(BASE).name
    seeds, screen = screen_of(study, a, k, tasks)
    if not seeds:
        return incomplete_line(completeness(study.raw, [a], k, tasks, study.planned)[1], k) \
            or [f"{name} has no seed at K = {k} on every task.", ""]
    raw = on_seeds(study.raw, (a, k), seeds)
    behind = {(who, against): [] for who in (a, BASE) for against in (1, k)}
    rows, sizes = [], set()
    for task in tasks:
        cells = []
        for who in (a, BASE):
            won = []
            for against in (1, k):
                xs, ys = finals(raw, (who, k), task), finals(raw, ("ppo", against), task)
                wins, pairings = pairs_won(xs, ys), len(xs) * len(ys)
                if pairings and wins <= CLEARLY_BEHIND * pairings:
                    behind[(who, against)].append(task)
                won.append(f"{wins} of {pairings}")
                sizes.add(pairings)
            cells.append(" / ".join(won))
        returns = [interval_cell(finals(raw, key, task)) for key in (("ppo", 1), ("ppo", k), (BASE, k), (a, k))]
        rows.append(f"| {task} | " + " | ".join(returns + cells) + " |")
    lines = [f"{name} at K = {k} on the {len(tasks)} tasks, on {seeds_text(seeds)}" + (f" ({screen})" if screen else "")
             + f", beside PPO without lag and at K = {k} and {base}, with all their seeds. Mean final return with its "
             f"95% t-interval; *won*: the pairings of seeds won against PPO at K = 1 / at K = {k}, of all; *clearly "
             f"behind*: at most {CLEARLY_BEHIND:.0%} of them won ({most_won_when_behind(sizes)}).", "",
             f"| task | PPO at K = 1 | PPO at K = {k} | {base} | {name} | {name}: won | {base}: won |",
             "|-|-|-|-|-|-|-|", *rows]
    lines += ["", f"Clearly behind synchronous PPO: {name} on {listed(behind[(a, 1)])}; {base} on "
              f"{listed(behind[(BASE, 1)])}. Clearly behind PPO at K = {k}: {name} on {listed(behind[(a, k)])}; {base} "
              f"on {listed(behind[(BASE, k)])}.", ""]
    matrices = {b: score_matrix(study.normalised, (b, k), study.main_tasks, "final") for b in ("ppo", BASE, a)}
    if not screen and study.main_tasks and all(m is not None for m in matrices.values()):
        points, intervals = aggregates(matrices, study.reps, study.seed)
        lines += [f"IQM of the normalised final score at K = {k} (1 = PPO at K = 1) over the {len(study.main_tasks)} "
                  "tasks: " + "; ".join(f"{method(b).name} {fmt_interval(points[b][1], intervals[b][:, 1])}"
                                        for b in matrices) + ".", ""]
    return lines + both_ways(study, a)


def both_ways(study, a):
    """The share of PPO's lag loss the remedy wins back at each K it ran above 1, on the tasks where lag hurts PPO at
    that K and the remedy ran at K = 1 too: against PPO at K = 1 and against itself at K = 1. Each block (the remedy
    at K, at K = 1) on the seeds that all those tasks have; the two are resampled apart, as PPO's are."""
    raw, name, rows, notes = study.raw, method(a).name, [], []
    for k in sorted(kk for alg, kk in study.keys if alg == a and kk > 1):
        tasks = [t for t in lag_hurt_tasks(raw, study.randoms, sorted(raw.get(("ppo", k), {})), k)
                 if raw.get((a, 1), {}).get(t) and raw[(a, k)].get(t)]
        (seeds_k, screen_k), (seeds_1, screen_1) = screen_of(study, a, k, tasks), screen_of(study, a, 1, tasks)
        if not seeds_k or not seeds_1:
            continue
        notes += [f"At K = {kk}, {screen}." for kk, screen in ((k, screen_k), (1, screen_1)) if screen]
        cut = on_seeds(on_seeds(raw, (a, 1), seeds_1), (a, k), seeds_k)
        # against itself only where it has a loss to win back: its mean at K = 1 above PPO's at K
        own = [t for t in tasks if np.mean(finals(cut, (a, 1), t)) > np.mean(finals(cut, ("ppo", k), t))]
        against_ppo = share_cells(tasks, tasks, lag_won_back(cut, tasks, k, [a], study.reps, study.seed)[a])
        against_itself = share_cells(tasks, own, lag_won_back(cut, own, k, [a], study.reps, study.seed,
                                                              against_itself=True)[a] if own else None)
        head = f"| {k} | {', '.join(map(str, seeds_k))}; {', '.join(map(str, seeds_1))} |"
        for task, *shares in zip(tasks, against_ppo, against_itself):
            rows.append(f"{head} {task} | {interval_cell(finals(cut, (a, 1), task))} | "
                        f"{interval_cell(finals(raw, ('ppo', 1), task))} | " + " | ".join(shares) + " |")
        rows.append(f"{head} **median** | | | {against_ppo[-1]} | {against_itself[-1]} |")
    if not rows:
        return [f"{name} has no run without lag on the tasks where lag hurts PPO.", ""]
    return [f"What {name} (X) wins back of PPO's lag loss, measured two ways, from the mean final returns with X and "
            "PPO at K: against PPO at K = 1, (X − PPO) / (PPO at K = 1 − PPO), as everywhere; and against itself at "
            "K = 1, (X − PPO) / (X at K = 1 − PPO), where 1 means that lag costs it nothing, and what it costs without "
            "lag is not counted (— where X at K = 1 ends no higher than PPO at K: no loss to win back, and no part "
            "of the median). The two differ by what it does without lag: its mean final return at K = 1 beside PPO's. "
            "95% stratified-bootstrap intervals; where the remedy has one seed, only the other runs' seeds are "
            "resampled, and the interval is too narrow. *Seeds*: the remedy's at K; at K = 1.", "",
            f"| K | seeds | task | {name} at K = 1 | PPO at K = 1 | against PPO at K = 1 | against itself at K = 1 |",
            "|-|-|-|-|-|-|-|", *rows, "", *dict.fromkeys(notes), *([""] if notes else [])]


def share_cells(tasks, among, estimate):
    """A column of shares: each task's (— for one not `among` those estimated), then the median's in bold; all — without
    an estimate. `estimate`: lag_won_back's (point, interval) over `among`."""
    if estimate is None:
        return ["—"] * (len(tasks) + 1)
    point, interval = estimate
    cells = [fmt_interval(point[among.index(t)], interval[:, among.index(t)]) if t in among else "—" for t in tasks]
    return cells + [f"**{fmt_interval(point[-1], interval[:, -1])}**"]


def listed(tasks):
    return f"{len(tasks)} task{'s' if len(tasks) != 1 else ''}" + (f" ({', '.join(tasks)})" if tasks else "")
