"""The report's figures of the whole grid: the IQM of the normalised final score against K for every main algorithm
(lag robustness), the aggregates' intervals without lag and at the largest K, and the learning curves."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import METRICS
from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.sections import sweep
from benchmark.study.sections.aggregates import aggregate_estimates, main_keys


def section(study):
    """Lag robustness (IQM against K), aggregate intervals, learning curves."""
    lines = ["## Figures", ""]
    if study.main_tasks:
        _, points, intervals = aggregate_estimates(study, main_keys(study), study.main_tasks, "final")
        ks = study.ks
        lag_figure(points, intervals, ks, study.main_tasks, study.figures.path("lag_robustness.png"))
        lines += [f"![lag robustness]({study.figures.link('lag_robustness.png')})", ""]
        for k in (1, max(ks)):
            algorithms = [a for a in MAIN_ALGORITHMS if f"{a} K={k}" in points]
            if algorithms:
                interval_figure(points, intervals, algorithms, k, study.main_tasks,
                                study.figures.path(f"aggregates_K{k}.png"))
                lines += [f"![aggregates K={k}]({study.figures.link(f'aggregates_K{k}.png')})", ""]
    plotting.curves_figure(study.runs, {key: study.raw[key] for key in study.grid_keys}, study.ks, sweep.variants(study),
                           study.figures.path("learning_curves.png"))
    return lines + [f"![learning curves]({study.figures.link('learning_curves.png')})", "",
                    "Learning curves: mean ± std over seeds (their number in brackets) of the return "
                    "of episodes ending in each 2% of training.", ""]


def lag_figure(points, intervals, ks, main_tasks, path):
    """Normalised IQM of the final score against K, every main algorithm, with 95% intervals."""
    plt = plotting.pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    with plt.rc_context(plotting.FONT):
        fig, ax = plt.subplots(figsize=(plotting.FIGURE_WIDTH, 5.4), layout="constrained")
        partial = {}  # algorithm: the Ks it ran at, when fewer than all
        for algorithm in MAIN_ALGORITHMS:
            pts = [(k, points[f"{algorithm} K={k}"][1], intervals[f"{algorithm} K={k}"][:, 1]) for k in ks
                   if f"{algorithm} K={k}" in points]
            if pts:
                x = [p[0] for p in pts]
                y = np.array([p[1] for p in pts])
                lo, hi = np.array([p[2][0] for p in pts]), np.array([p[2][1] for p in pts])
                complete = len(x) == len(ks)
                c = plotting.colour(algorithm)
                ax.plot(x, y, marker=plotting.marker(algorithm), ms=7, label=plotting.name(algorithm), color=c,
                        lw=2.4 if algorithm in ("ppo", "vaco") else 1.4,
                        ls="-" if complete else "--" if len(x) > 1 else "none")  # one point: no line to draw
                if complete:
                    ax.fill_between(x, lo, hi, alpha=0.15, color=c)
                else:  # run at fewer K: dashed line, intervals only where measured
                    partial[algorithm] = x
                    ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="none", ecolor=c, capsize=3, lw=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        plotting.k_axis(ax, ks, "policy lag K (actors act with one of the last K policies)")
        ax.set_ylabel("IQM of normalised final score\n(1 = PPO at K = 1)")
        names = ", ".join(t.split("-")[0] for t in main_tasks)
        ax.set_title(f"Lag robustness ({names})" if len(main_tasks) <= 4 else f"Lag robustness, {len(main_tasks)} tasks")
        ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=3 if len(ax.get_lines()) <= 3 else 2)
        # the line styles as drawn: the Ks of the figure named, and a method measured at one K a point, not a line
        style = [((Line2D([], [], color="grey", lw=2), Patch(color="grey", alpha=0.15)),
                  f"run at {plotting.k_list(ks)}: solid line, band = 95 % interval")]
        if partial:
            measured = sorted({tuple(x) for x in partial.values()})
            where = plotting.k_list(measured[0]) + " only" if len(measured) == 1 else "fewer K"
            if all(len(x) == 1 for x in measured):
                style.append((Line2D([], [], color="grey", ls="none", marker="o"),
                              f"run at {where}: a point, bar = 95 % interval"))
            else:
                style.append((Line2D([], [], color="grey", lw=1.4, ls="--", marker="o"),
                              f"run at {where}: the dashed line only joins\n"
                              "the measured points, bars = 95 % interval"))
        fig.legend(*zip(*style), loc="outside lower center", handlelength=2.5)
    plotting.save(fig, path)


def interval_figure(points, intervals, algorithms, k, tasks, path):
    """rliable's aggregate intervals of METRICS at one K, a 2 x 2 grid (one metric a panel)."""
    plt = plotting.pyplot()
    with plt.rc_context(plotting.FONT):
        fig, axes = plt.subplots(2, 2, figsize=(plotting.FIGURE_WIDTH, 2.6 + 0.9 * len(algorithms)), sharey=True,
                                 layout="constrained")
        for i, (ax, metric) in enumerate(zip(axes.flat, METRICS)):
            for row, algorithm in enumerate(algorithms):
                name = f"{algorithm} K={k}"
                lo, hi = intervals[name][:, i]
                ax.barh(row, hi - lo, left=lo, height=0.6, color=plotting.colour(algorithm), alpha=0.85,
                        edgecolor="black", lw=0.6)
                ax.vlines(points[name][i], row - 0.3, row + 0.3, color="black", lw=1.5)
            ax.set_title(metric + ("\n(lower is better)" if metric == "Optimality Gap" else ""))
            ax.margins(x=0.08)
            ax.set_xlabel("normalised score")
            ax.xaxis.set_major_locator(plt.MaxNLocator(4))
            ax.grid(True, axis="x", alpha=0.25)
            for side in ("top", "right", "left"):
                ax.spines[side].set_visible(False)
        axes[0][0].set_yticks(range(len(algorithms)), [plotting.name(a) for a in algorithms])
        axes[0][0].invert_yaxis()  # the first algorithm on top
        for row in axes:
            row[0].set_ylabel("algorithm")
        where = ", ".join(t.split("-")[0] for t in tasks) if len(tasks) <= 3 else f"{len(tasks)} tasks"
        fig.suptitle(f"K = {k}, {where}, normalised final score:\npoint estimate (black) and 95 % interval")
    plotting.save(fig, path)
