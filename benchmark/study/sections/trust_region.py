"""Which part wins lag back, the advantages or the trust region: at the grid's largest K, every method under lag
beside PPO, made of which advantages and which trust region; their IQM, P(X > PPO), P(X > decoupled PPO), the share
of PPO's lag loss won back and the seed pairs won, per method and per task; then one variable at a time (the
advantages under one trust region, the trust region under V-trace), the diagnostics where the methods disagree, and
a figure of the IQMs."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import aggregates, lag_won_back, probability_of_improvement
from benchmark.study.presets import LAG_METHODS, method
from benchmark.study.report import fmt_interval, incomplete_line, seeds_cell, titled
from benchmark.study.scores import (above_random_ratio, completeness, finals, lag_hurt_tasks,
                                    logged_means, pairs_won, score_matrix)

# one variable at a time: (what changes, [(from, to)]) between methods that differ in that part only
ONE_VARIABLE = [("the advantages, GAE → V-trace", [("ppo-decoupled", "vtrace-decoupled"), ("geppo-gae", "geppo")]),
                ("the trust region, all with V-trace", [("vtrace-decoupled", "vaco"), ("vtrace-decoupled", "vaco-proximal-0.1"),
                                                        ("vtrace-decoupled", "geppo"), ("vaco", "vaco-proximal-0.1"),
                                                        ("vaco-proximal-0.1", "geppo"), ("vaco", "geppo")])]
CLEARLY_BEHIND = 2 / 9  # a method is clearly behind PPO on a task where it wins at most this share of the seed pairs


def most_won_when_behind(pairings, lost=False):
    """What "clearly behind" allows at each number of pairings of seeds: "2 of 9, 5 of 25" won at most (or, with
    `lost`, "7 of 9, 20 of 25" lost at least), so that the share reads at every number of seeds."""
    allowed = {n: int(CLEARLY_BEHIND * n) for n in sorted(set(pairings)) if n}
    return ", ".join(f"{n - w if lost else w} of {n}" for n, w in allowed.items())


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    runs, raw, normalised, randoms, tasks = study.runs, study.raw, study.normalised, study.randoms, study.compared
    k, reps, seed = max(study.ks), study.reps, study.seed
    methods, partial = completeness(raw, LAG_METHODS, k, tasks, study.planned)
    if len(methods) < 2:
        return f"fewer than two methods under lag with all their runs in at K = {k}: nothing to set side by side"
    if not all(finals(raw, ("ppo", kk), t) for kk in (1, k) for t in tasks):
        return f"PPO did not run at K = 1 and {k} on every task"
    matrices = {a: score_matrix(normalised, (a, k), tasks, "final") for a in ["ppo", *methods]}
    points, intervals = aggregates(matrices, reps, seed)
    pairs = {f"{a},{b}": (matrices[a], matrices[b]) for a in methods for b in ("ppo", "ppo-decoupled")
             if b in matrices and a != b}
    pairs.update({f"{to},{frm}": (matrices[to], matrices[frm]) for _, steps in ONE_VARIABLE for frm, to in steps
                  if frm in matrices and to in matrices})
    improvement, improvement_ci = probability_of_improvement(pairs, reps, seed)
    p = lambda a, b: fmt_interval(improvement[f"{a},{b}"], improvement_ci[f"{a},{b}"].ravel()) \
        if f"{a},{b}" in improvement else ""  # noqa: E731
    hurt = lag_hurt_tasks(raw, randoms, tasks, k)
    shares = lag_won_back(raw, hurt, k, methods, reps, seed) if hurt else {}
    won = {a: [(pairs_won(finals(raw, (a, k), t), finals(raw, ("ppo", k), t)),
                len(finals(raw, (a, k), t)) * len(finals(raw, ("ppo", k), t))) for t in tasks] for a in methods}
    behind = {a: [t for t, (w, n) in zip(tasks, won[a]) if w <= CLEARLY_BEHIND * n] for a in methods}
    lines = [f"At K = {k} on {len(tasks)} tasks ({', '.join(tasks)}). *Seeds*: how many each task ran; the pairings "
             "and intervals use every seed a method has. *IQM*: of the normalised final score (1 = PPO at K = 1). "
             "*P(X > Y)*: the probability that a run of X beats a run of Y on a task drawn at random. 95% "
             f"stratified-bootstrap intervals ({reps} resamples).", "",
             f"| method | seeds | advantages | trust region | IQM at K={k} | P(X > PPO) | P(X > decoupled PPO) |",
             "|-|-|-|-|-|-|-|"]
    for a in ["ppo", *methods]:
        advantages, trust_region = method(a).parts
        lines.append(f"| {method(a).name} | {seeds_cell(raw, (a, k), tasks)} | {advantages} | {trust_region} | "
                     f"{fmt_interval(points[a][1], intervals[a][:, 1])} | {p(a, 'ppo')} | {p(a, 'ppo-decoupled')} |")
    if hurt:
        lines += ["", f"*Lag won back*: the share of PPO's loss from K = 1 to K = {k} that X wins back, median over "
                  f"the {len(hurt)} tasks where lag hurts PPO ({', '.join(hurt)}), with its interval, and the range of "
                  "the per-task shares. *Pairs won*: of every pairing of a seed of X with a seed of PPO at "
                  f"K = {k}, on all {len(tasks)} tasks, those where X's final return is higher. *Clearly behind PPO*: "
                  f"the tasks where X wins at most {CLEARLY_BEHIND:.0%} of its pairs "
                  f"({most_won_when_behind(n for a in methods for _, n in won[a])}).", "",
                  "| method | lag won back (median) | range over tasks | pairs won | clearly behind PPO on |",
                  "|-|-|-|-|-|"]
        for a in methods:
            point, interval = shares[a]
            lines.append(f"| {method(a).name} | {fmt_interval(point[-1], interval[:, -1])} | "
                         f"{point[:len(hurt)].min():.2f} to {point[:len(hurt)].max():.2f} | "
                         f"{sum(w for w, _ in won[a])}/{sum(n for _, n in won[a])} | {', '.join(behind[a]) or 'none'} |")
    lines += ["", f"Per task: *X/PPO*, (X − random) / (PPO − random) of the mean final returns at K = {k}, and the seed "
              "pairs X wins against PPO; bold where X is clearly behind PPO.", "",
              "| task | " + " | ".join(method(a).name for a in methods) + " |", "|-|" + "-|" * len(methods)]
    for i, task in enumerate(tasks):
        cells = []
        for a in methods:
            w, n = won[a][i]
            cell = f"{above_random_ratio(finals(raw, (a, k), task), finals(raw, ('ppo', k), task), randoms[task]):.2f} ({w}/{n})"
            cells.append(f"**{cell}**" if task in behind[a] else cell)
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    steps = [(what, frm, to) for what, pairs_of in ONE_VARIABLE for frm, to in pairs_of if frm in methods + ["ppo"]
             and to in methods]
    if steps:
        lines += ["", "One variable at a time: two methods that differ in one part only. *P(to > from)* on all "
                  f"{len(tasks)} tasks; *lag won back*: the medians above; *either side of PPO*: the tasks where one "
                  "of the two is ahead of PPO and the other behind (mean final returns).", "",
                  "| what changes | from | to | P(to > from) | lag won back, from → to | either side of PPO |",
                  "|-|-|-|-|-|-|"]
        for what, frm, to in steps:
            moved = f"{shares[frm][0][-1]:.2f} → {shares[to][0][-1]:.2f}" if frm in shares and to in shares else ""
            ppo = {t: np.mean(finals(raw, ("ppo", k), t)) for t in tasks}
            split = [t for t in tasks if (np.mean(finals(raw, (frm, k), t)) > ppo[t])
                     != (np.mean(finals(raw, (to, k), t)) > ppo[t])]
            lines.append(f"| {what} | {method(frm).name} | {method(to).name} | {p(to, frm)} | {moved} | {', '.join(split) or 'none'} |")
    lines += disputed_diagnostics(runs, raw, randoms, tasks, k, methods)
    figure(points, intervals, ["ppo", *methods], k, len(tasks), study.figures.path("trust_region.png"))
    return (titled("Which part wins lag back: the advantages and the trust region", "trust_region",
                   lines + [""] + incomplete_line(partial, k))
            + [f"![trust region]({study.figures.link('trust_region.png')})", ""])


def disputed_diagnostics(runs, raw, randoms, tasks, k, methods):
    """On each task where one method is ahead of PPO at K = k and another behind (mean final returns), what
    each logged: backward TV, clip or filter fraction, the TV from π_T during the update, entropy, and GePPO's
    learning-rate factor at the end."""
    ppo = {t: np.mean(finals(raw, ("ppo", k), t)) for t in tasks}
    disputed = [t for t in tasks if len({np.mean(finals(raw, (a, k), t)) > ppo[t] for a in methods}) > 1]
    if not disputed:
        return []
    lines = ["", f"Where the methods disagree at K = {k} (one ahead of PPO, another behind), means over runs and "
             "updates. *Clip or filter*: the share of samples outside the clip range or band (PPO, decoupled, GePPO), "
             "or detached by the filter (VACO). *TV from π_T*: ½·mean|π_θ/β − π_T/β| per minibatch (GePPO's; for "
             "the others the TV from β, *tv_divergence*, is in the CSVs). *Rate factor*: GePPO's actor learning rate "
             "over the critic's at the last update.", "",
             "| task | method | X/PPO | backward TV | clip or filter | TV from π_T | entropy | rate factor |",
             "|-|-|-|-|-|-|-|-|"]
    for task in disputed:
        for a in ["ppo", *methods]:
            d = logged_means(runs, (a, k), [task])
            fraction = d.get("filtered_fraction", d.get("clipfrac"))
            factor = final_rate_factor(runs, (a, k), task)
            cells = [f"{above_random_ratio(finals(raw, (a, k), task), finals(raw, ('ppo', k), task), randoms[task]):.2f}",
                     f"{d['backward_tv']:.3g}" if "backward_tv" in d else "", f"{fraction:.3g}" if fraction is not None
                     else "", f"{d['proximal_tv']:.3g}" if "proximal_tv" in d else "",
                     f"{d['entropy']:.3g}" if "entropy" in d else "", f"{factor:.2f}" if factor is not None else ""]
            lines.append(f"| {task} | {method(a).name} | " + " | ".join(cells) + " |")
    return lines


def final_rate_factor(runs, key, task):
    """GePPO's learning-rate factor at the last of n updates, mean over seeds: the actor's rate over the annealed
    rate, which is the first update's times 1 - (n - 1) / n (the rule has not acted before the first update)."""
    factors = [float(rows[-1]["actor_learning_rate"]) * len(rows) / float(rows[0]["actor_learning_rate"])
               for meta, rows in runs if (meta["algorithm"], meta["k"]) == key and meta["task"] == task
               and rows and rows[-1].get("actor_learning_rate", "") != "" and float(rows[0]["actor_learning_rate"]) > 0]
    return float(np.mean(factors)) if factors else None


def figure(points, intervals, methods, k, n_tasks, path):
    """The IQM of the normalised final score at K = k of every method under lag, highest first, as a bar from PPO's
    IQM at K = k (the baseline: what a method adds under the same lag) with its 95 % interval; PPO last, a point with
    its interval, and synchronous PPO (1) dashed. The axis spans the intervals, not 0 to them."""
    plt = plotting.pyplot()
    base = points["ppo"][1]
    order = sorted((a for a in methods if a != "ppo"), key=lambda a: -points[a][1]) + ["ppo"]
    with plt.rc_context(plotting.FONT):
        fig, ax = plt.subplots(figsize=(plotting.FIGURE_WIDTH, 2.2 + 0.55 * len(order)), layout="constrained")
        for i, a in enumerate(order):
            iqm, (lo, hi) = points[a][1], intervals[a][:, 1]
            c = plotting.colour(a)
            if a != "ppo":
                ax.barh(i, iqm - base, left=base, height=0.6, color=c, alpha=0.85, edgecolor="black", lw=0.6)
            ax.errorbar(iqm, i, xerr=[[iqm - lo], [hi - iqm]], fmt=plotting.marker(a), color="black", mfc=c, ms=8,
                        capsize=4, lw=1.2)
        ax.axvline(base, color=plotting.colour("ppo"), lw=1.2)
        ax.axvline(1, color="grey", lw=1, ls="--")
        ends = np.concatenate([intervals[a][:, 1] for a in order] + [[1.0]])
        pad = 0.08 * (ends.max() - ends.min())
        ax.set_xlim(ends.min() - pad, ends.max() + pad)
        ax.set_yticks(range(len(order)), [plotting.name(a) for a in order])
        ax.set_ylabel("method")
        ax.invert_yaxis()
        ax.set_xlabel(f"IQM of the normalised final score at K = {k}\n({n_tasks} tasks; 1 = PPO at K = 1, dashed)",
                      loc="right")
        ax.set_title(f"bar: gain over PPO at K = {k} (solid line)\nblack: 95 % interval", loc="right")
        ax.grid(True, axis="x", alpha=0.25)
    plotting.save(fig, path)
