"""How the study's figures look: their colours, markers and names, how the report links them, and the learning
curves, which the report and benchmark/study/script_curves.py both draw; their size, fonts and palette are every
benchmark's (benchmark/common.py: 6.4 in wide, text of at least MIN_FONT_PT, 10 px high on a phone).

At most two panels a row; every axis labelled, legends outside the data, algorithms under their names on the pages
(`name`), not their ids in the study; colours from Okabe and Ito's palette, which colour-blind readers tell apart, and a
marker each, all from the methods' records (presets.METHODS). `save` records the smallest font and the resolution in
the PNG (`min-font-pt`, `dpi`), and .ci/check_pages.py checks how large that text is on the pages.
"""

import os
import warnings
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from benchmark.common import FIGURE_DPI, FIGURE_WIDTH, FONT, MIN_FONT_PT, OKABE_ITO, pyplot, save_figure  # noqa: F401
from benchmark.study.presets import MAIN_ALGORITHMS, SWEEP_PALETTE, method
from benchmark.study.scores import slice_scores


def colour(algorithm, sweep=()):
    """An algorithm's colour (its record's, presets.METHODS); a sweep's variants take the sweep's palette, in their
    order."""
    if algorithm in sweep:
        return OKABE_ITO[SWEEP_PALETTE[sorted(sweep).index(algorithm) % len(SWEEP_PALETTE)]]
    return OKABE_ITO[method(algorithm).colour]


def marker(algorithm, sweep=()):
    return "o" if algorithm in sweep else method(algorithm).marker


def name(algorithm, sweep=()):
    """An algorithm's name in a figure: "decoupled PPO", not "ppo-decoupled"; a sweep's variant by its threshold and
    reference ("VACO, δ = 0.2 against β"); π_T drawn as maths."""
    text = method(algorithm).sweep_name if algorithm in sweep else method(algorithm).name
    return text.replace("π_T", r"$\pi_T$").replace("π_θ", r"$\pi_\theta$")


def legend_columns(labels):
    """Two legend columns where every label fits half a figure at the docs' width, else one."""
    return 2 if max(map(len, labels)) <= 24 else 1


def figure_labels(fig):
    """The labels of every line in `fig` that a figure legend shows."""
    return [label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]


def save(fig, path):
    """Write a figure of the study (benchmark/common.py's save_figure; the tests watch this name)."""
    save_figure(fig, path)


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
    from matplotlib.ticker import FuncFormatter, MaxNLocator

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
                ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
                ax.grid(True, alpha=0.25)
        legend = [a for a in order if a in handles]
        n = {a: (f"{min(seeds[a])}" if len(seeds[a]) == 1 else f"{min(seeds[a])}–{max(seeds[a])}") for a in legend}
        labels = [f"{name(a, sweep)} ({n[a]} seed{'' if n[a] == '1' else 's'})" for a in legend]
        fig.legend([handles[a] for a in legend], labels, loc="outside upper center",
                   ncol=legend_columns(labels), title="mean over seeds (line) ± one std (band)")
    save(fig, path)
