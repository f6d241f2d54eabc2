"""Does a remedy trade anything away where lag hurts less: a remedy (presets.REMEDIES, but for the methods under
lag, whose own sections cover them at this K) at the grid's largest K on every task, beside PPO and decoupled PPO, the
method it changes. Per task the mean final return of each, and the seed pairings the remedy wins against synchronous
PPO and against PPO at that K (clearly behind: at most 2 of 9 won, as the trust-region section counts), on the seeds
that every task has; then, where the remedy also ran without lag, the share of PPO's lag loss it wins back measured
two ways: against PPO at K = 1, and against itself at K = 1, so that what it wins back is lag and not a change to
synchronous training."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import aggregates, lag_won_back
from benchmark.study.presets import LAG_METHODS, REMEDIES
from benchmark.study.report import fmt_interval, interval_cell, titled
from benchmark.study.scores import finals, lag_hurt_tasks, pairs_won, score_matrix
from benchmark.study.sections.remedies import BASE
from benchmark.study.sections.trust_region import CLEARLY_BEHIND


def section(study):
    k = max(study.ks)
    found = [a for a in REMEDIES if (a, k) in study.raw and a not in LAG_METHODS]  # those have sections at this K
    if not found:
        return f"no run of a remedy at K = {k}"
    lines = []
    for a in found:
        lines += titled(f"{plotting.NAMES[a]} at K = {k} and without lag", f"remedy_grid_{a}", remedy(study, a, k))
    return lines


def common_seeds(raw, key, tasks):
    """The seeds that `key` ran on every one of `tasks` (none if a task has none)."""
    return sorted(set.intersection(*(set(raw.get(key, {}).get(t, {})) for t in tasks))) if tasks else []


def on_seeds(raw, key, seeds):
    """raw with `key`'s runs cut to `seeds`: every task of a table then has the same seeds."""
    return {**raw, key: {t: {s: v for s, v in runs.items() if s in seeds} for t, runs in raw[key].items()}}


def planned_of(study, a, k):
    return {(t, s) for t, alg, kk, s in study.planned if (alg, kk) == (a, k)}


def remedy(study, a, k):
    raw, tasks, name = study.raw, study.compared, plotting.NAMES[a]
    seeds = common_seeds(raw, (a, k), tasks)
    plan = planned_of(study, a, k)
    runs_in = sum(len(raw[(a, k)].get(t, {})) for t in tasks)
    if not seeds:
        return [f"Incomplete at K = {k}: {name} has {runs_in} of {len(plan) or '?'} runs, and no seed on every task.",
                ""]
    raw = on_seeds(raw, (a, k), seeds)
    n_seeds = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    missing = len(plan) - runs_in if plan else 0
    lines = [f"{name} at K = {k} on the {len(tasks)} tasks, on {n_seeds}"
             + (f" ({runs_in} of the {len(plan)} runs planned are in: a screen, until the rest are)" if missing > 0
                else "") + f", beside PPO without lag and at K = {k}, and {plotting.NAMES[BASE]}, with all their "
             f"seeds. Mean final return with its 95% t-interval; *won*: the pairings of seeds that {name} (in the "
             f"last column {plotting.NAMES[BASE]}) wins, of all; *clearly behind*: at most {CLEARLY_BEHIND:.2f} of "
             "them won.", "",
             f"| task | PPO at K = 1 | PPO | {plotting.NAMES[BASE]} | {name} | won against PPO at K = 1 | won against "
             f"PPO | {plotting.NAMES[BASE]}: won against PPO |", "|-|-|-|-|-|-|-|-|"]
    behind = {"sync": [], "lagged": [], "base": []}
    for task in tasks:
        x, base = finals(raw, (a, k), task), finals(raw, (BASE, k), task)
        sync, lagged = finals(raw, ("ppo", 1), task), finals(raw, ("ppo", k), task)
        cells = []
        for who, xs, ys in (("sync", x, sync), ("lagged", x, lagged), ("base", base, lagged)):
            won, n = pairs_won(xs, ys), len(xs) * len(ys)
            if n and won <= CLEARLY_BEHIND * n:
                behind[who].append(task)
            cells.append(f"{won} of {n}" if n else "")
        lines.append(f"| {task} | " + " | ".join(interval_cell(v) for v in (sync, lagged, base, x)) + " | "
                     + " | ".join(cells) + " |")
    lines += ["", f"Clearly behind synchronous PPO: {name} on {listed(behind['sync'])}. Clearly behind PPO at K = {k}: "
              f"{name} on {listed(behind['lagged'])}; {plotting.NAMES[BASE]} on {listed(behind['base'])}.", ""]
    matrices = {b: score_matrix(study.normalised, (b, k), study.main_tasks, "final") for b in ("ppo", BASE, a)}
    if all(m is not None for m in matrices.values()):
        points, intervals = aggregates({b: m for b, m in matrices.items()}, study.reps, study.seed)
        lines += [f"IQM of the normalised final score at K = {k} (1 = PPO at K = 1) over the {len(study.main_tasks)} "
                  "tasks: " + "; ".join(f"{'PPO' if b == 'ppo' else plotting.NAMES[b]} "
                                        f"{fmt_interval(points[b][1], intervals[b][:, 1])}" for b in matrices)
                  + (f" ({name} on {n_seeds} only)" if missing > 0 else "") + ".", ""]
    return lines + both_ways(study, a)


def both_ways(study, a):
    """The share of PPO's lag loss the remedy wins back at each K where it ran, on the tasks where lag hurts PPO there
    and the remedy ran at K = 1 too, against PPO at K = 1 and against itself at K = 1."""
    raw, name, lines = study.raw, plotting.NAMES[a], []
    for k in sorted(kk for alg, kk in study.keys if alg == a and kk > 1):
        tasks = [t for t in lag_hurt_tasks(raw, study.randoms, sorted(raw.get(("ppo", k), {})), k)
                 if raw.get((a, 1), {}).get(t) and raw[(a, k)].get(t)]
        seeds = sorted(set(common_seeds(raw, (a, 1), tasks)) & set(common_seeds(raw, (a, k), tasks)))
        if not seeds:
            continue
        cut = on_seeds(on_seeds(raw, (a, 1), seeds), (a, k), seeds)
        ways = [lag_won_back(cut, tasks, k, [a], study.reps, study.seed, against_itself=mine)[a]
                for mine in (False, True)]
        if not lines:
            lines = [f"What {name} wins back of PPO's lag loss, measured two ways: against PPO at K = 1, "
                     "(X − PPO) / (PPO at K = 1 − PPO) at K, and against itself at K = 1, (X − PPO) / (X at K = 1 − "
                     "PPO), where 1 means lag costs it nothing. The two differ by what it does without lag (its mean "
                     "final return at K = 1 beside PPO's). 95% stratified-bootstrap intervals, on the seeds it ran both "
                     "at K = 1 and at that K (the remedy's; PPO's are all its seeds).", "",
                     f"| K | seeds | task | {name} at K = 1 | PPO at K = 1 | against PPO at K = 1 | against itself at "
                     "K = 1 |", "|-|-|-|-|-|-|-|"]
        head = f"| {k} | {', '.join(map(str, seeds))} |"
        for i, task in enumerate(tasks):
            lines.append(f"{head} {task} | {interval_cell(finals(cut, (a, 1), task))} | "
                         f"{interval_cell(finals(raw, ('ppo', 1), task))} | "
                         + " | ".join(fmt_interval(point[i], interval[:, i]) for point, interval in ways) + " |")
        lines.append(f"{head} **median** | | | "
                     + " | ".join(f"**{fmt_interval(point[-1], interval[:, -1])}**" for point, interval in ways) + " |")
    return lines + [""] if lines else [f"{name} has no run without lag on the tasks where lag hurts PPO.", ""]


def listed(tasks):
    return f"{len(tasks)} task{'s' if len(tasks) != 1 else ''}" + (f" ({', '.join(tasks)})" if tasks else "")
