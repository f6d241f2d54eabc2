"""Remedies for lag: decoupled PPO beside what was tried to win more of PPO's lag loss back at a lag above the
grid's (presets.REMEDIES: an exact-KL stop on the update, the stale samples left out, GePPO's band and rate on GAE's
advantages, V-trace's advantages with the KL stop), on the tasks PPO ran at that K. Per task the share of PPO's lag
loss each wins back, with its interval, and how wide each policy ends beside synchronous PPO's; then the return
and the entropy against env steps. One section for each such K."""

import warnings

import numpy as np

from benchmark.study import plotting
from benchmark.study.estimates import lag_won_back
from benchmark.study.presets import REMEDIES, method
from benchmark.study.report import incomplete_line, per_lag, share_rows
from benchmark.study.scores import completeness, lag_hurt_tasks, slice_means, slice_scores

BASE = "ppo-decoupled"  # the method the remedies change
GOAL = 0.75  # the share of the lag loss a remedy is to win back on every task


def section(study):
    lags = sorted({k for a, k in study.keys if a in REMEDIES and k > max(study.ks) and ("ppo", k) in study.raw})
    if not lags:
        return "no run of a remedy at a lag above the grid's, beside PPO"
    return per_lag(study, lags, remedies, lambda k: f"Remedies at K = {k}", "remedies")


def remedies(study, k):
    """The section's lines at K = k, and whether it drew its figure."""
    raw, reps, seed = study.raw, study.reps, study.seed
    hurt = lag_hurt_tasks(raw, study.randoms, sorted(raw.get(("ppo", k), {})), k)  # PPO at K = 1 and k on each
    methods, partial = completeness(raw, [BASE, *REMEDIES], k, hurt, study.planned)
    if not hurt or not any(a in REMEDIES for a in methods):
        return [f"No remedy has all its runs at K = {k} on tasks where lag hurts PPO.", ""] \
            + incomplete_line(partial, k), False
    seeds = {a: sorted({len(raw[(a, k)][t]) for t in hurt}) for a in methods}
    heads = [f"{method(a).name} ({'–'.join(map(str, seeds[a]))} seed{'s' if seeds[a] != [1] else ''})"
             for a in methods]
    shares = lag_won_back(raw, hurt, k, methods, reps, seed)
    lines = [f"What was tried to win back more of PPO's loss from K = 1 to K = {k}, beside {method(BASE).name}, "
             "the method the remedies change: the share of that loss each wins back, from the mean final returns, "
             f"(X − PPO) / (PPO at K = 1 − PPO) with X and PPO at K = {k}: 0 is PPO under this lag, 1 is synchronous "
             "PPO. 95% stratified-bootstrap intervals (with 1 seed, only PPO's "
             f"seeds are resampled). The goal: {GOAL} or more on every task; the last row counts the tasks whose share "
             "reaches it.", "", "| task | " + " | ".join(heads) + " |", "|-|" + "-|" * len(methods),
             *share_rows(hurt, methods, shares)]
    reached = [sum(shares[a][0][i] >= GOAL for i in range(len(hurt))) for a in methods]
    lines.append(f"| tasks at {GOAL} or more | " + " | ".join(f"{n} of {len(hurt)}" for n in reached) + " |")
    lines += ["", *entropy_table(study.runs, methods, k, hurt)]
    figure(study.runs, ["ppo", *methods], k, hurt, study.figures.path(f"remedies_K{k}.png"))
    return lines + incomplete_line(partial, k), True


def entropy_table(runs, methods, k, tasks):
    """How wide each policy ends: its entropy in the last 10% of steps beside synchronous PPO's (mean over seeds, and
    the range of synchronous PPO's seeds)."""
    keys = [("ppo", 1), ("ppo", k), *((a, k) for a in methods)]
    ends = {key: final_entropies(runs, key, tasks) for key in keys}
    if not all(ends.values()):
        return ["(No entropy table: some of these runs did not log the entropy.)", ""]
    lines = ["How wide each policy ends: the entropy of its Gaussian, in nats summed over the action's dimensions, mean "
             "over the updates in the last 10% of steps, mean over seeds; the higher, the wider. It is below 0 once "
             "the standard deviation is under about 0.24 per dimension, so only the comparison counts: synchronous "
             "PPO's comes with the lowest and highest of its seeds, the range the others are read against. Below "
             "that range, the policy ends narrower than synchronous PPO's on the task.", "",
             "| task | PPO at K = 1 | PPO | " + " | ".join(method(a).name for a in methods) + " |",
             "|-|-|-|" + "-|" * len(methods)]
    for task in tasks:
        sync = ends[("ppo", 1)][task]
        cells = [f"{np.mean(ends[key][task]):.2f}" for key in keys[1:]]
        lines.append(f"| {task} | {np.mean(sync):.2f} [{min(sync):.2f}, {max(sync):.2f}] | " + " | ".join(cells) + " |")
    return lines + [""]


def final_entropies(runs, key, tasks):
    """{task: [each seed's mean entropy over the updates in its last 10% of steps]} of one algorithm and K, or {}
    when a task's runs did not log the entropy."""
    ends = {t: [slice_means(rows, "entropy", meta["total_timesteps"])[-1] for meta, rows in runs
                if (meta["algorithm"], meta["k"], meta["task"]) == (*key, t)] for t in tasks}
    return ends if all(v and not np.isnan(v).any() for v in ends.values()) else {}


def figure(runs, methods, k, tasks, path):
    """A row per task: the return and the entropy against env steps, mean over seeds, of each method at K = k and of
    PPO at K = 1 (dashed)."""
    plt = plotting.pyplot()
    from matplotlib.ticker import FuncFormatter

    curves = {}  # (algorithm, K, task) -> [(steps, [returns, entropies] in 50 slices)] over seeds
    for meta, rows in runs:
        key, steps = (meta["algorithm"], meta["k"], meta["task"]), meta["total_timesteps"]
        if meta["task"] in tasks and (key[:2] == ("ppo", 1) or (key[0] in methods and key[1] == k)):
            pair = [slice_scores(rows, steps, 50), slice_means(rows, "entropy", steps, 50)]
            curves.setdefault(key, []).append((steps, pair))
    with plt.rc_context(plotting.FONT):
        fig, axes = plt.subplots(len(tasks), 2, figsize=(plotting.FIGURE_WIDTH, 1.6 + 2.4 * len(tasks)),
                                 layout="constrained", squeeze=False)
        for task, row in zip(tasks, axes):
            for a, kk in [("ppo", 1)] + [(a, k) for a in methods]:
                found = curves.get((a, kk, task))
                if not found:
                    continue
                steps = max(n for n, _ in found)
                for panel, ax in enumerate(row):
                    with warnings.catch_warnings():  # a slice where no seed's episode ended
                        warnings.simplefilter("ignore", RuntimeWarning)
                        y = np.nanmean([pair[panel] for _, pair in found], axis=0)
                    x = np.linspace(0, steps, len(y) + 1)[1:] / 1e6
                    label = "PPO at K = 1" if kk == 1 else plotting.name(a)
                    shown = label if (task, panel) == (tasks[0], 0) else None  # one legend entry per line
                    ax.plot(x[~np.isnan(y)], y[~np.isnan(y)], color="grey" if kk == 1 else plotting.colour(a),
                            ls="--" if kk == 1 else "-", lw=1.6, label=shown)
            for panel, ax in enumerate(row):
                ax.set_title(f"{task}: {'return' if panel == 0 else 'entropy'}")
                ax.set_xlabel("env steps (millions)")
                ax.set_ylabel("episode return" if panel == 0 else "policy entropy")
                if panel == 0:
                    ax.yaxis.set_major_formatter(FuncFormatter(plotting.compact_thousands))
                ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=plotting.legend_columns(plotting.figure_labels(fig)),
                   title=f"K = {k}, mean over seeds; PPO at K = 1 dashed")
    plotting.save(fig, path)
