"""How the study's figures look: their size, fonts and colours, where they are saved and how the report links them;
and the learning curves, which the report and benchmark/study/script_curves.py both draw.

Drawn for a docs column of 6.4 in (1280 px at FIGURE_DPI; the page shows it at its column's width): at most two
panels a row, so that on a phone (about 400 px wide) a panel is still half the screen; every axis labelled, legends
at FONT["legend.fontsize"] pt and outside the data.
"""

import os
import warnings
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.scores import slice_scores

FIGURE_DPI = 200
FIGURE_WIDTH = 6.4
FONT = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
        "ytick.labelsize": 11, "legend.fontsize": 11, "legend.title_fontsize": 11, "figure.titlesize": 12}
# one colour per algorithm in every figure (matplotlib's tab10); the sweep's variants take the rest
COLOURS = dict(zip(MAIN_ALGORITHMS, [f"C{i}" for i in range(len(MAIN_ALGORITHMS) - 1)] + ["teal"]))
COLOURS.update({"vaco-proximal-0.1": "C8", "vtrace-decoupled": "C9", "geppo": "olive", "geppo-gae": "darkkhaki"})
SWEEP_COLOURS = ["C8", "C9", "black", "C7", "gold", "navy"]


def colour(algorithm, sweep=()):
    """An algorithm's colour; a sweep's variants take the sweep's palette, in their order."""
    if algorithm in sweep:
        return SWEEP_COLOURS[sorted(sweep).index(algorithm) % len(SWEEP_COLOURS)]
    return COLOURS.get(algorithm, "black")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    fig.savefig(path, dpi=FIGURE_DPI)
    pyplot().close(fig)


def k_axis(ax, ks, label="policy lag K"):
    """An x axis of policy lags K: a log2 scale with a tick at each of `ks`."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel(label)


def k_list(ks):
    """"K = 1 and 8", "K = 1, 2 and 8"."""
    ks = [str(k) for k in ks]
    return "K = " + (ks[0] if len(ks) == 1 else ", ".join(ks[:-1]) + " and " + ks[-1])


@dataclass
class FigureFolder:
    """Where figures are saved, and how the report (in another folder, maybe) links to them."""
    folder: str
    report_folder: str

    def path(self, name):
        return os.path.join(self.folder, name)

    def link(self, name):
        return os.path.relpath(self.path(name), self.report_folder)


def compact_thousands(value, _position=None):
    """A tick label: 150000 -> "150k" (returns of 10^5 would widen the axis labels past the panel)."""
    return f"{value / 1000:g}k" if abs(value) >= 10_000 else f"{value:g}"


def curves_figure(runs, keys, ks, sweep, path, shown=None):
    """Learning curves (PPO, VACO, SPO, decoupled PPO and the sweep's variants when there are few of them,
    e.g. the finalists; or the algorithms in `shown`): one block per task, titled with its name, of one
    panel per K, two panels a row."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    tasks = sorted({t for key in keys for t in keys[key]})
    cols = 2 if len(ks) > 1 else 1
    rows = -(-len(ks) // cols)  # per task
    curves, steps = defaultdict(list), {}
    if shown is None:
        shown = {"ppo", "vaco", "spo", "ppo-decoupled"} | (set(sweep) if len(sweep) <= 3 else set())
    for meta, rows_ in runs:
        if meta["algorithm"] in shown:
            key = (meta["task"], meta["k"], meta["algorithm"])
            curves[key].append(slice_scores(rows_, meta["total_timesteps"], slices=50))
            steps[key] = max(steps.get(key, 0), meta["total_timesteps"])
    order = [a for a in MAIN_ALGORITHMS if a in shown] + sorted(shown - set(MAIN_ALGORITHMS))
    seeds, handles = defaultdict(set), {}
    with plt.rc_context(FONT):
        fig = plt.figure(figsize=(FIGURE_WIDTH, len(tasks) * (2.15 * rows + 0.4) + 1.1), layout="constrained")
        for task, block in zip(tasks, np.atleast_1d(fig.subfigures(len(tasks), 1))):
            block.suptitle(task, fontweight="bold")
            axes = block.subplots(rows, cols, squeeze=False)
            for ax in axes.flat[len(ks):]:
                ax.set_visible(False)
            for k, ax in zip(ks, axes.flat):
                for algorithm in order:
                    cs = curves.get((task, k, algorithm))
                    if not cs:
                        continue
                    c = np.array(cs)
                    x = np.linspace(0, steps[(task, k, algorithm)], c.shape[1] + 1)[1:] / 1e6
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        mean, std = np.nanmean(c, 0), np.nanstd(c, 0)
                    ended = ~np.isnan(mean)  # slices where no episode ended (long episodes, short runs) are bridged
                    x, mean, std = x[ended], mean[ended], std[ended]
                    handles[algorithm], = ax.plot(x, mean, color=colour(algorithm, sweep), lw=1.6)
                    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=colour(algorithm, sweep), lw=0)
                    seeds[algorithm].add(len(cs))
                ax.set_title(f"K = {k}")
                ax.set_xlabel("env steps (millions)")
                ax.set_ylabel("episode return")
                ax.yaxis.set_major_formatter(FuncFormatter(compact_thousands))
                ax.grid(True, alpha=0.25)
        legend = [a for a in order if a in handles]
        n = {a: (f"{min(seeds[a])}" if len(seeds[a]) == 1 else f"{min(seeds[a])}–{max(seeds[a])}") for a in legend}
        labels = [f"{a} ({n[a]} seed{'' if n[a] == '1' else 's'})" for a in legend]
        fig.legend([handles[a] for a in legend], labels, loc="outside upper center",
                   ncol=2, title="mean over seeds (line) ± one std (band)")
    save(fig, path)
