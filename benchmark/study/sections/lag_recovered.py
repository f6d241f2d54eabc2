"""Lag recovered: the tasks where lag hurts PPO at the grid's largest K, and on each the share of PPO's loss that
each method under lag wins back; their mean and median over these tasks, and P(X > PPO) at that K; then a figure
of the shares."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import lag_won_back, probability_of_improvement
from benchmark.study.presets import LAG_METHODS, method
from benchmark.study.report import fmt_interval, incomplete_line, seeds_note, titled
from benchmark.study.scores import LAG_HURTS, above_random_ratio, completeness, finals, lag_hurt_tasks, score_matrix


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    raw, normalised, tasks, k, reps = study.raw, study.normalised, study.compared, max(study.ks), study.reps
    hurt = lag_hurt_tasks(raw, study.randoms, tasks, k)
    algorithms, partial = completeness(raw, LAG_METHODS, k, tasks, study.planned)
    if not hurt:
        return f"no task where lag hurts PPO at K = {k}"
    if not algorithms:
        return f"no method under lag with all its runs in at K = {k}"
    estimates = lag_won_back(raw, hurt, k, algorithms, reps, study.seed)
    pairs = {}
    for algorithm in algorithms:
        for name, among in (("these tasks", hurt), (f"all {len(tasks)} tasks", tasks)):
            x = score_matrix(normalised, (algorithm, k), among, "final")
            ppo = score_matrix(normalised, ("ppo", k), among, "final")
            if x is not None and ppo is not None:
                pairs[f"{algorithm},{name}"] = (x, ppo)
    points, intervals = probability_of_improvement(pairs, reps, study.seed) if pairs else ({}, {})
    names = [method(a).name for a in algorithms]
    seeds = seeds_note(raw, [("ppo", 1), ("ppo", k)] + [(a, k) for a in algorithms], tasks)
    lines = [f"Where lag hurts PPO: the tasks where PPO's mean final return at K = {k} is below {LAG_HURTS} of its "
             f"mean at K = 1, both measured above the random policy: {', '.join(hurt)}. On each, the share of PPO's "
             f"loss that X wins back, (X at K = {k} − PPO at K = {k}) / (PPO at K = 1 − PPO at K = {k}) of the mean "
             "final returns: 1 = all of it, 0 = none, below 0 = X behind PPO under lag. 95% stratified-bootstrap "
             f"intervals ({reps} resamples of each task's seeds, per algorithm and K). P(X > PPO): the probability "
             f"that a run of X beats a run of PPO at K = {k} on a task drawn at random (normalised final scores)."
             + seeds, "",
             f"| task | PPO K={k} / K=1, above random | " + " | ".join(names) + " |", "|-|-|" + "-|" * len(names)]
    for i, task in enumerate(hurt):
        lost = above_random_ratio(finals(raw, ("ppo", k), task), finals(raw, ("ppo", 1), task), study.randoms[task])
        lines.append(f"| {task} | {lost:.2f} | "
                     + " | ".join(fmt_interval(estimates[a][0][i], estimates[a][1][:, i]) for a in algorithms) + " |")
    for j, name in ((-2, "mean"), (-1, "median")):
        lines.append(f"| **{name} over these {len(hurt)} tasks** | | "
                     + " | ".join(f"**{fmt_interval(estimates[a][0][j], estimates[a][1][:, j])}**" for a in algorithms)
                     + " |")
    for name in ("these tasks", f"all {len(tasks)} tasks"):
        cells = [fmt_interval(points[f"{a},{name}"], intervals[f"{a},{name}"].ravel()) if f"{a},{name}" in points
                 else "" for a in algorithms]
        lines.append(f"| P(X > PPO) at K={k}, {name} | | " + " | ".join(cells) + " |")
    figure(hurt, algorithms, estimates, k, study.figures.path("lag_recovered.png"))
    return (titled("Lag recovered", "lag_recovered", lines + [""] + incomplete_line(partial, k))
            + [f"![lag recovered]({study.figures.link('lag_recovered.png')})", ""])


def figure(tasks, algorithms, estimates, k, path, *, lo=-1.5, hi=3.0):
    """The share of PPO's lag loss each algorithm wins back: their median and mean over the tasks where lag hurts PPO,
    then each of those tasks; a block of rows each, one row an algorithm, its estimate a point with its 95 % interval.
    The axis holds `lo` to `hi`: an interval that runs past it ends in an arrowhead at the edge (its ends are in the
    table), never cut silently."""
    plt = plotting.pyplot()
    n = len(tasks)
    groups = [(f"median over {n} tasks", -1), (f"mean over {n} tasks", -2)] + [(t, i) for i, t in enumerate(tasks)]
    rows_per = len(algorithms) + 1.2  # a gap between blocks
    with plt.rc_context(plotting.FONT):
        fig, ax = plt.subplots(figsize=(plotting.FIGURE_WIDTH, 2.3 + 0.21 * rows_per * len(groups)),
                               layout="constrained")
        for g, (_, column) in enumerate(groups):
            if g:
                ax.axhline(g * rows_per - 0.6 - 0.5, color="grey", lw=0.6, alpha=0.5)
            for j, algorithm in enumerate(algorithms):
                point, interval = estimates[algorithm][0][column], estimates[algorithm][1][:, column]
                y, c = g * rows_per + j, plotting.colour(algorithm)
                left, right = max(interval[0], lo), min(interval[1], hi)
                ax.plot([left, right], [y, y], color=c, lw=2, solid_capstyle="butt")
                for end, edge, arrow in ((interval[0], lo, "<"), (interval[1], hi, ">")):
                    if (end < edge) if arrow == "<" else (end > edge):
                        ax.plot([edge], [y], marker=arrow, color=c, ms=9, clip_on=False)
                shown = lo <= point <= hi  # an estimate past the axis shows as the arrow only
                ax.plot([point if shown else np.nan], [y], marker=plotting.marker(algorithm), color=c, ms=8,
                        mec="black", mew=0.6, ls="none", label=plotting.name(algorithm) if g == 0 else None)
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(1, color="grey", lw=1, ls="--")
        ax.set_xlim(lo, hi)
        ax.set_xticks(np.arange(np.ceil(lo), hi + 0.01, 1.0))
        ax.set_xticks(np.arange(np.ceil(lo * 2) / 2, hi + 0.01, 0.5), minor=True)
        ax.set_ylim(len(groups) * rows_per - 1.2 + 0.2 - 0.5, -0.8)  # the first block on top
        ax.set_yticks([g * rows_per + (len(algorithms) - 1) / 2 for g in range(len(groups))], [t for t, _ in groups])
        ax.set_ylabel("task where lag hurts PPO")
        ax.set_xlabel(f"share of PPO's lag loss won back at K = {k}\n(0: none; 1: all of it, dashed)", loc="right")
        ax.grid(True, axis="x", which="both", alpha=0.25)
        fig.legend(loc="outside upper center", ncol=plotting.legend_columns(plotting.figure_labels(fig)),
                   title="point: estimate; line: 95 % interval;\n▶: goes on past the axis")
    plotting.save(fig, path)
