"""The TV threshold sweep: VACO's threshold delta x the filter's reference policy (beta or pi_T), without lag and at
K = 8: the IQM of the normalised final and AUC scores, the filter's activity, the ranking by which the default was
chosen, and a figure of the IQM against delta."""

from collections import defaultdict

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import aggregates
from benchmark.study.presets import DELTAS, SWEEP
from benchmark.study.report import fmt_interval, marked
from benchmark.study.scores import logged_means, score_matrix


def section(study):
    runs, normalised, reps, seed = study.runs, study.normalised, study.reps, study.seed
    sweep = variants(study)
    tasks = sorted({task for (a, _), tasks in study.raw.items() if a in sweep for task in tasks})
    if not tasks:
        return "fewer than two variants of VACO's threshold and reference"
    lines = [f"Tasks: {', '.join(tasks)}. IQM of normalised scores with 95% intervals; "
             "filter diagnostics are means over runs and updates: *filter on*, the share of minibatches "
             "whose TV exceeded delta; *filtered*, the share of samples detached; *TV*, the TV the filter "
             "compares with delta; *KL*, the approximate KL(beta || pi) per update. At K = 1 the proximal "
             "policy is the behaviour policy, so the proximal variants are run at K > 1 only.", "",
             "| variant | K | seeds | IQM final | IQM AUC | filter on | filtered | TV | backward TV | KL |",
             "|-|-|-|-|-|-|-|-|-|-|"]
    plot = defaultdict(dict)
    for k in (1, 8):
        for metric in ("final", "auc"):
            matrices = {a: m for a in ["ppo"] + sweep
                        if (m := score_matrix(normalised, (a, k), tasks, metric)) is not None}
            if matrices:
                points, intervals = aggregates(matrices, reps, seed)
                for a in matrices:
                    plot[(a, k)][metric] = (points[a], intervals[a], matrices[a].shape[0])
    for k in (1, 8):
        for a in ["ppo"] + sweep:
            if (a, k) not in plot or len(plot[(a, k)]) < 2:
                continue
            (pf, cf, n), (pa, ca, _) = plot[(a, k)]["final"], plot[(a, k)]["auc"]  # point, interval, seeds
            d = logged_means(runs, (a, k), tasks)
            get = lambda c: f"{d[c]:.3f}" if c in d else ""  # noqa: E731
            lines.append(f"| {a} | {k} | {n} | {fmt_interval(pf[1], cf[:, 1])} | {fmt_interval(pa[1], ca[:, 1])} | "
                         f"{get('filter_on_fraction')} | {get('filtered_fraction')} | {get('filter_tv')} | "
                         f"{get('backward_tv')} | {get('approx_kl')} |")
    lines += ["", "Ranking: the mean over K of the IQM of the normalised final score (a proximal variant's "
              "K = 1 score is that of its behaviour twin, the same run).", "",
              "| variant | K = 1 | K = 8 | mean |", "|-|-|-|-|"]
    ranking = []
    for a in sweep:
        twin = a.replace("proximal", "behaviour")
        k1 = plot.get((a, 1), plot.get((twin, 1), {})).get("final")
        k8 = plot.get((a, 8), {}).get("final")
        if k1 and k8:
            ranking.append(((k1[0][1] + k8[0][1]) / 2, a, k1[0][1], k8[0][1]))
    for mean, a, k1, k8 in sorted(ranking, reverse=True):
        lines.append(f"| {a} | {k1:.2f} | {k8:.2f} | {mean:.2f} |")
    figure(plot, sweep, study.figures.path("delta_sensitivity.png"))
    return ["## TV threshold sweep", "", *marked("sweep", lines),
            f"![delta sensitivity]({study.figures.link('delta_sensitivity.png')})", ""]


def variants(study):
    """The sweep's variants of VACO (threshold and reference) that ran at the grid's lags; none when there is one
    only (the ten tasks' VACO against pi_T: a method, no sweep)."""
    sweep = sorted({a for a, _ in study.grid_keys if a in SWEEP})
    return sweep if len(sweep) > 1 else []


def figure(plot, sweep, path):
    """IQM against delta for each reference of the filter: rows final and AUC score, columns K = 1, 8."""
    plt = plotting.pyplot()
    with plt.rc_context(plotting.FONT):
        fig, axes = plt.subplots(2, 2, figsize=(plotting.FIGURE_WIDTH, 6.4), layout="constrained", squeeze=False)
        handles = {}
        for row, metric in enumerate(("final", "auc")):
            for col, k in enumerate((1, 8)):
                ax = axes[row][col]
                for reference, marker, c in (("behaviour", "o", plotting.OKABE_ITO["blue"]),
                                            ("proximal", "s", plotting.OKABE_ITO["orange"])):
                    pts = sorted((float(a.rsplit("-", 1)[1]), plot[(a, k)][metric]) for a in sweep
                                 if a.startswith(f"vaco-{reference}-") and metric in plot.get((a, k), {}))
                    if pts:
                        deltas = [d for d, _ in pts]
                        iqm = np.array([p[0][1] for _, p in pts])
                        lo, hi = np.array([p[1][0, 1] for _, p in pts]), np.array([p[1][1, 1] for _, p in pts])
                        handles[reference] = ax.errorbar(deltas, iqm, yerr=[iqm - lo, hi - iqm], marker=marker,
                                                         color=c, capsize=3, lw=1.8)
                if metric in plot.get(("ppo", k), {}):
                    handles["ppo"] = ax.axhline(plot[("ppo", k)][metric][0][1], color="grey", lw=1.2, ls="--")
                ax.set_xscale("log")
                ax.set_xticks(DELTAS, [str(d) for d in DELTAS])
                ax.minorticks_off()
                ax.set_xlabel("TV threshold δ")
                ax.set_ylabel("normalised IQM")
                ax.set_title(f"K = {k}, {'AUC' if metric == 'auc' else metric} score")
                ax.grid(True, alpha=0.25)
        labels = {"behaviour": r"TV against the behaviour policy $\beta$",
                  "proximal": r"TV against the proximal policy $\pi_T$", "ppo": "PPO at the same K"}
        order = [name for name in labels if name in handles]
        fig.legend([handles[n] for n in order], [labels[n] for n in order], loc="outside upper center", ncol=1,
                   title="normalised IQM (1 = PPO at K = 1) with 95 % interval;\nat K = 1 the two references are the same runs")
    plotting.save(fig, path)
