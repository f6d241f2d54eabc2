"""How much lag: a larger lag than the grid's, run on fewer tasks (the tasks PPO ran at it), beside K = 1 and the
grid's largest K: per task and method the normalised final score at each K; the IQM over those tasks at each K; the
share of PPO's lag loss won back at the larger K; and what each method logs at both lags (backward TV, the weight
pi_T/beta and how often decoupled PPO's cap binds, clip or filter fraction, entropy). Then a figure of the score
against K. One section for each larger K."""

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import aggregates, lag_won_back
from benchmark.study.presets import LAG_METHODS, method
from benchmark.study.report import fmt_interval, incomplete_line, per_lag, seeds_note, share_rows
from benchmark.study.scores import completeness, finals, lag_hurt_tasks, logged_means, score_matrix


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    k_main = max(study.ks)
    larger = sorted({k for _, k in study.keys if k > k_main and ("ppo", k) in study.raw})
    if not larger:
        return f"no run of PPO at a K above the grid's {k_main}"
    return per_lag(study, larger, scan, lambda k: f"How much lag: K = 1, {k_main} and {k}", "lag_scan")


def scan(study, k):
    """The section's lines at K = k, and whether it drew its figure."""
    runs, raw, normalised, randoms, k_main = study.runs, study.raw, study.normalised, study.randoms, max(study.ks)
    reps, seed = study.reps, study.seed
    tasks = sorted(raw.get(("ppo", k), {}))
    methods, partial = completeness(raw, LAG_METHODS, k, tasks, study.planned)
    if not tasks or not all(finals(raw, ("ppo", kk), t) for kk in (1, k_main) for t in tasks):
        return incomplete_line(partial, k), False
    scan_ks = [1, k_main, k]
    finished = {kk: completeness(raw, methods, kk, tasks, study.planned)[0] for kk in scan_ks}  # no block still running
    keys = [(a, kk) for a in ["ppo", *methods] for kk in scan_ks
            if (a == "ppo" or a in finished[kk]) and all(finals(raw, (a, kk), t) for t in tasks)]
    seeds = seeds_note(raw, keys, tasks)
    lines = [f"Lag K = {k} (snapshots 0 to {k - 1} updates old, {(k - 1) / 2:g} on average once the buffer is full, after "
             f"{k - 1} updates) on {', '.join(tasks)}, beside K = 1 and {k_main}, every method at its K = {k_main} settings. "
             "Normalised final score, mean over seeds (1 = PPO at K = 1, 0 = random)."
             + seeds, "",
             "| task | method | " + " | ".join(f"K = {kk}" for kk in scan_ks) + " |", "|-|-|" + "-|" * len(scan_ks)]
    for task in tasks:
        for a in ["ppo", *methods]:
            cells = [f"{np.mean([s['final'] for s in normalised[(a, kk)][task].values()]):.2f}"
                     if (a, kk) in keys else "" for kk in scan_ks]
            lines.append(f"| {task} | {method(a).name} | " + " | ".join(cells) + " |")
    matrices = {f"{a} K={kk}": score_matrix(normalised, (a, kk), tasks, "final") for a, kk in keys}
    points, intervals = aggregates(matrices, reps, seed)
    lines += ["", f"IQM over these {len(tasks)} tasks × seeds, with 95% stratified-bootstrap intervals ({reps} "
              "resamples).", "", "| method | " + " | ".join(f"K = {kk}" for kk in scan_ks) + " |",
              "|-|" + "-|" * len(scan_ks)]
    for a in ["ppo", *methods]:
        cells = [fmt_interval(points[f"{a} K={kk}"][1], intervals[f"{a} K={kk}"][:, 1]) if (a, kk) in keys else ""
                 for kk in scan_ks]
        lines.append(f"| {method(a).name} | " + " | ".join(cells) + " |")
    hurt = lag_hurt_tasks(raw, randoms, tasks, k)
    if hurt and methods:
        shares = lag_won_back(raw, hurt, k, methods, reps, seed)
        lines += ["", f"The share of PPO's loss from K = 1 to K = {k} that X wins back, from the mean final returns, "
                  f"(X − PPO) / (PPO at K = 1 − PPO) with X and PPO at K = {k} (0 is PPO under this lag, 1 is "
                  f"synchronous PPO), on the tasks where lag hurts PPO at K = {k} "
                  f"({', '.join(hurt)}), with 95% stratified-bootstrap intervals.", "",
                  "| task | " + " | ".join(method(a).name for a in methods) + " |", "|-|" + "-|" * len(methods),
                  *share_rows(hurt, methods, shares)]
    lines += ["", f"What each method logs at K = {k_main} and K = {k}, means over runs and updates on these tasks. *w*: "
              "π_T/β at the update's start (V-trace's ρ, decoupled PPO's weight, the centre of GePPO's band): its "
              "mean, and the mean over updates of its largest value; *w > 100*: the share of updates whose largest w "
              "passed 100, where decoupled PPO's weight is capped. *Clip or filter*: the share of samples outside "
              "the clip range or band, or detached by the filter.", "",
              "| method | K | backward TV | w mean | w max | w > 100 | clip or filter | entropy |", "|-|-|-|-|-|-|-|-|"]
    for a in ["ppo", *methods]:
        for kk in (k_main, k):
            if (a, kk) not in keys:
                continue
            d = logged_means(runs, (a, kk), tasks)
            fraction = d.get("filtered_fraction", d.get("clipfrac"))
            get = lambda c: f"{d[c]:.3g}" if c in d else ""  # noqa: E731
            capped = cap_share(runs, (a, kk), tasks)
            lines.append(f"| {method(a).name} | {kk} | {get('backward_tv')} | {get('backward_ratio_mean')} | "
                         f"{get('backward_ratio_max')} | {'' if capped is None else f'{capped:.2f}'} | "
                         f"{'' if fraction is None else f'{fraction:.3g}'} | {get('entropy')} |")
    figure(normalised, (points, intervals), keys, tasks, study.figures.path(f"lag_scan_K{k}.png"), ks=scan_ks)
    return lines + [""] + incomplete_line(partial, k), True


def cap_share(runs, key, tasks, cap=100.0):
    """The share of updates, over the runs of `key` on `tasks`, whose largest pi_T/beta passed `cap`: where decoupled
    PPO's weight was capped (its cap is 100)."""
    maxima = [float(r["backward_ratio_max"]) for meta, rows in runs if (meta["algorithm"], meta["k"]) == key
              and meta["task"] in tasks for r in rows if r.get("backward_ratio_max", "") != ""]
    return float(np.mean(np.array(maxima) > cap)) if maxima else None


def figure(normalised, estimates, keys, tasks, path, *, ks):
    """The normalised final score against `ks`: the IQM over the tasks with its interval (`estimates`: aggregates'
    points and intervals), then each task's mean over seeds (two panels a row), every method of `keys` ((algorithm,
    K) that ran, in the order drawn) a colour."""
    plt = plotting.pyplot()
    points, intervals = estimates
    methods = list(dict.fromkeys(a for a, _ in keys))
    rows = (len(tasks) + 2) // 2
    with plt.rc_context(plotting.FONT):
        fig, axes = plt.subplots(rows, 2, figsize=(plotting.FIGURE_WIDTH, 1.6 + 2.6 * rows), layout="constrained",
                                 squeeze=False)
        for panel, ax in enumerate(axes.flat):
            if panel > len(tasks):
                ax.set_visible(False)
                continue
            for a in methods:
                run_ks = [kk for kk in ks if (a, kk) in keys]
                if panel == 0:
                    y = np.array([points[f"{a} K={kk}"][1] for kk in run_ks])
                    lo, hi = (np.array([intervals[f"{a} K={kk}"][i, 1] for kk in run_ks]) for i in (0, 1))
                    ax.errorbar(run_ks, y, yerr=[y - lo, hi - y], marker=plotting.marker(a), ms=7, capsize=3,
                                color=plotting.colour(a), label=plotting.name(a), lw=1.6)
                else:
                    y = [np.mean([s["final"] for s in normalised[(a, kk)][tasks[panel - 1]].values()]) for kk in run_ks]
                    ax.plot(run_ks, y, marker=plotting.marker(a), ms=7, color=plotting.colour(a), lw=1.6)
            ax.axhline(1, color="grey", lw=0.8, ls="--")
            plotting.k_axis(ax, ks)
            ax.set_ylabel("normalised final score")
            ax.set_title(f"IQM over {len(tasks)} tasks" if panel == 0 else tasks[panel - 1])
            ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=plotting.legend_columns(plotting.figure_labels(fig)),
                   title="first panel: IQM with 95 % interval;\nthe tasks' panels: mean over seeds")
    plotting.save(fig, path)
