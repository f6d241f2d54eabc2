"""Lag recovered: the tasks where lag hurts PPO at the grid's largest K, and on each the share of PPO's loss that
each method under lag wins back; their mean and median over these tasks, and P(X > PPO) at that K; then a figure
of the shares."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import lag_won_back, probability_of_improvement
from benchmark.study.presets import LAG_METHODS
from benchmark.study.report import fmt_interval, incomplete_line, titled
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
    names = [LAG_METHODS[a] for a in algorithms]
    lines = [f"Where lag hurts PPO: the tasks where PPO's mean final return at K = {k} is below {LAG_HURTS} of its "
             f"mean at K = 1, both measured above the random policy: {', '.join(hurt)}. On each, the share of PPO's "
             f"loss that X wins back, (X at K = {k} − PPO at K = {k}) / (PPO at K = 1 − PPO at K = {k}) of the mean "
             "final returns: 1 = all of it, 0 = none, below 0 = X behind PPO under lag. 95% stratified-bootstrap "
             f"intervals ({reps} resamples of each task's seeds, per algorithm and K). P(X > PPO): the probability "
             f"that a run of X beats a run of PPO at K = {k} on a task drawn at random (normalised final scores).", "",
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


def figure(tasks, algorithms, estimates, k, path):
    """Per task where lag hurts PPO, and their mean: the share of PPO's lag loss each algorithm wins back."""
    plt = plotting.pyplot()
    rows = tasks + [f"mean over {len(tasks)} tasks", f"median over {len(tasks)} tasks"]
    height = 0.8 / len(algorithms)
    with plt.rc_context(plotting.FONT):
        fig, ax = plt.subplots(figsize=(plotting.FIGURE_WIDTH, 1.6 + 0.55 * len(rows)), layout="constrained")
        for j, algorithm in enumerate(algorithms):
            point, interval = estimates[algorithm]
            y = np.arange(len(rows)) + (j - (len(algorithms) - 1) / 2) * height
            ax.barh(y, point, height=height * 0.9, color=plotting.colour(algorithm), alpha=0.8,
                    label=LAG_METHODS[algorithm])
            ax.errorbar(point, y, xerr=[point - interval[0], interval[1] - point], fmt="none", ecolor="black",
                        capsize=2, lw=1)
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(1, color="grey", lw=0.8, ls="--")
        ax.axvline(0.5, color="grey", lw=0.8, ls=":")
        # a task where PPO loses little has a share with a huge interval: the axis stops at -1.5 and 3
        ends = np.concatenate([estimates[a][1].ravel() for a in algorithms])
        ax.set_xlim(max(-1.5, ends.min() - 0.1), min(3.0, ends.max() + 0.1))
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylabel("task where lag hurts PPO")
        ax.invert_yaxis()  # the first task on top, the mean last
        ax.set_xlabel(f"share of PPO's loss from K = 1 to K = {k} won back\n"
                      "(0: PPO under lag, 1: without lag; axis cut at -1.5, 3)")
        ax.grid(True, axis="x", alpha=0.25)
        fig.legend(loc="outside upper center", ncol=min(3, len(algorithms)), title="estimate with 95 % interval")
    plotting.save(fig, path)
