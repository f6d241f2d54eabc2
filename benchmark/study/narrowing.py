"""Why the methods centred on pi_T narrow the policy under lag: runs of lag_by_age.py (seed 1, 1M steps) at K = 32 and,
for reference, synchronous PPO, and what they show, as report.md and a figure.

    python benchmark/study/narrowing.py --run     # the runs of RUNS, 2 at a time, resumable (about 2 h on 2 cores)
    python benchmark/study/narrowing.py --figures-dir docs/img/lag_by_age   # report.md and narrowing.png from their CSVs

Each run writes <task>__<algorithm>__K<k>.csv into benchmark/results/lag-by-age/ (lag_by_age.py's columns: one row
per update and snapshot age, and one per update for the whole batch); the algorithms are the study's
(presets.METHODS), with their flags.
"""

import csv
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, ROOT  # noqa: E402
from benchmark.study import plotting  # noqa: E402
from benchmark.study.presets import method  # noqa: E402
from benchmark.study.report import marked  # noqa: E402

FOLDER = os.path.join(RESULTS, "lag-by-age")
# (task, algorithm, K): decoupled PPO at K = 32 where lag costs it most (Walker2d, Hopper) and least (Ant), beside
# synchronous PPO on the same task; V-trace + decoupled clip, which narrows most, on Hopper
RUNS = [("Walker2d-v4", "ppo-decoupled", 32), ("Walker2d-v4", "ppo", 1), ("Hopper-v4", "ppo", 1),
        ("Hopper-v4", "ppo-decoupled", 32), ("Hopper-v4", "vtrace-decoupled", 32), ("Ant-v4", "ppo", 1),
        ("Ant-v4", "ppo-decoupled", 32)]
AGE_BINS = [(0, 0), (1, 3), (4, 7), (8, 15), (16, 23), (24, 31)]
FIRST, LAST = 32, 250  # the updates read: from a full buffer of 32 snapshots to the middle of the run


def csv_path(task, algorithm, k):
    return os.path.join(FOLDER, f"{task}__{algorithm}__K{k}.csv")


def command(task, algorithm, k, out):
    script, flags = method(algorithm).script, method(algorithm).flags
    return [sys.executable, os.path.join(ROOT, "benchmark", "study", "lag_by_age.py"), script, "--out", out, "--",
            "--env-id", task, "--policy-buffer", str(k), "--seed", "1", "--total-timesteps", "1000000",
            "--exp-name", algorithm, *flags]


def run(task, algorithm, k):
    """One run in a scratch folder (its TensorBoard log is dropped); returns its CSV's path."""
    path = csv_path(task, algorithm, k)
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(command(task, algorithm, k, path), cwd=scratch, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{os.path.basename(path)} failed: {done.stderr.strip()[-2000:]}")
    return path


def load(task, algorithm, k):
    """{"ages": rows per age, "batch": rows of the whole batch}, numbers as floats, or None before the run."""
    path = csv_path(task, algorithm, k)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        rows = [{key: (value if key == "age" else float(value) if value != "" else np.nan)
                 for key, value in row.items()} for row in csv.DictReader(f)]
    return {"ages": [r for r in rows if r["age"] != "all"], "batch": [r for r in rows if r["age"] == "all"]}


def window(rows):
    return [r for r in rows if FIRST <= r["update"] <= LAST]


def by_age(runs_rows, bins=AGE_BINS):
    """Per age bin over the window's updates: the share of samples, their mean advantage, |z| and w (sample-weighted),
    and their share of the first step's push on the log-std (the bin's push over the batch's)."""
    rows = window(runs_rows["ages"])
    total_push = sum(r["logstd_push"] for r in window(runs_rows["batch"]))
    samples = sum(r["samples"] for r in rows)
    out = []
    for lo, hi in bins:
        part = [r for r in rows if lo <= int(r["age"]) <= hi]
        n = np.array([r["samples"] for r in part])
        mean = lambda key: float(np.average([r[key] for r in part], weights=n))  # noqa: E731
        out.append(dict(ages=f"{lo}" if lo == hi else f"{lo}–{hi}", share=n.sum() / samples,
                        advantage=mean("advantage_mean"), abs_z=mean("abs_z_mean"), weight=mean("weight_mean"),
                        push=sum(r["logstd_push"] for r in part) / total_push))
    return out


def per_update(runs_rows):
    """Over the window's updates: the entropy's mean change in the first epoch and in the whole update, the first
    step's push with and without centring the advantages within each age, how often the entropy fell in the updates
    whose first step pushed wider, and the median KL between consecutive policies (from the means, from the std)."""
    rows = [r for r in window(runs_rows["batch"]) if not np.isnan(r["entropy_change"])]
    get = lambda key: np.array([r[key] for r in rows])  # noqa: E731
    wider = get("logstd_push") > 0
    return dict(first_epoch=get("entropy_change_first_epoch").mean(), update=get("entropy_change").mean(),
                push=get("logstd_push").mean(), push_centred=get("logstd_push_centred").mean(),
                fell_when_wider=float(np.mean(get("entropy_change")[wider] < 0)) if wider.any() else np.nan,
                kl_mean=float(np.median(get("move_kl_mean"))), kl_std=float(np.median(get("move_kl_std"))))


def report(figures_dir=None):
    """The report's lines; its figure goes to `figures_dir` (default: beside the report), which the report links."""
    figures_dir = figures_dir or FOLDER
    found = {(t, a, k): load(t, a, k) for t, a, k in RUNS}
    missing = [os.path.basename(csv_path(*key)) for key, rows in found.items() if rows is None]
    found = {key: rows for key, rows in found.items() if rows is not None}
    stale = [(t, a, k) for t, a, k in found if k > 1]
    lines = ["# Why the policy narrows under lag", "",
             f"Runs of `benchmark/study/lag_by_age.py` (seed 1, 1M steps), updates {FIRST} to {LAST}."
             + (f" Not run yet: {', '.join(missing)}." if missing else ""), "", "## The batch by snapshot age", ""]
    table = ["Per group of snapshot ages (0: π_T itself): its share of the batch; its mean advantage, in batch "
             "standard deviations; mean |a − μ_T(s)| / σ_T (0.80 for actions drawn from π_T); mean w = π_T/β; and its "
             "share of the first step's push on the log-std, −∂L/∂log σ of the script's loss on the whole batch at "
             "θ = π_T (the shares sum to 1).", "", "| task | method | ages | share | advantage | abs z | w | push |",
             "|-|-|-|-|-|-|-|-|"]
    for t, a, k in stale:
        for b in by_age(found[(t, a, k)]):
            table.append(f"| {t} | {method(a).name} | {b['ages']} | {b['share']:.2f} | {b['advantage']:+.2f} | "
                         f"{b['abs_z']:.2f} | {b['weight']:.2f} | {b['push']:.2f} |")
    lines += marked("narrowing_by_age", table)
    lines += ["## The update, from its first step to its last epoch", ""]
    table = ["Means over updates of the entropy's change during the update's first epoch and during all 10; the first "
             "step's push on the log-std (< 0 narrows), and the same with the advantages centred within each age; the "
             "share of the updates whose first step pushed wider that still ended narrower; and the median exact KL "
             "from the policy before an update to the policy after it, from the means and from the std.", "",
             "| task | method | K | entropy, first epoch | entropy, update | push | push, centred by age | "
             "narrower though pushed wider | KL, means | KL, std |", "|-|-|-|-|-|-|-|-|-|-|"]
    for t, a, k in found:
        u = per_update(found[(t, a, k)])
        table.append(f"| {t} | {method(a).name} | {k} | {u['first_epoch']:+.4f} | {u['update']:+.4f} | {u['push']:+.4f} | "
                     f"{u['push_centred']:+.4f} | {u['fell_when_wider']:.2f} | {u['kl_mean']:.4f} | "
                     f"{u['kl_std']:.5f} |")
    lines += marked("narrowing_update", table)
    if found:
        os.makedirs(figures_dir, exist_ok=True)
        figure(found, os.path.join(figures_dir, "narrowing.png"))
        link = os.path.relpath(os.path.join(figures_dir, "narrowing.png"), FOLDER)
        lines += [f"![why the policy narrows]({link})", ""]
    return lines


def figure(found, path):
    """Four panels: the mean advantage and |z| by snapshot age (runs at K = 32); the entropy against updates; its
    change per update, in the first epoch and in all of them (every run)."""
    plt = plotting.pyplot()
    palette = [plotting.OKABE_ITO[c] for c in ("blue", "vermillion", "green", "orange", "sky", "purple", "black")]
    colours = {key: palette[i % len(palette)] for i, key in enumerate(found)}
    label = lambda t, a, k: f"{t.split('-')[0]}, {method(a).name}, K = {k}"  # noqa: E731
    with plt.rc_context(plotting.FONT):
        fig, axes = plt.subplots(2, 2, figsize=(plotting.FIGURE_WIDTH, 7.4), layout="constrained")
        for key, rows in found.items():
            batch = rows["batch"]
            axes[1, 0].plot([r["update"] for r in batch], [r["entropy"] for r in batch], color=colours[key], lw=1.4,
                            label=label(*key))
            if key[2] == 1:
                continue
            ages = sorted({int(r["age"]) for r in rows["ages"]})
            for ax, column in ((axes[0, 0], "advantage_mean"), (axes[0, 1], "abs_z_mean")):
                means = [np.mean([r[column] for r in window(rows["ages"]) if int(r["age"]) == age]) for age in ages]
                ax.plot(ages, means, color=colours[key], lw=1.4)
        # the entropy's change per update, a group of bars per task: each run a pair (first epoch, all epochs)
        changes = {key: per_update(rows) for key, rows in found.items()}
        tasks = list(dict.fromkeys(t for t, _, _ in found))
        slot = 0.8 / max(sum(t == task for t, _, _ in found) for task in tasks)
        for i, task in enumerate(tasks):
            keys = [key for key in found if key[0] == task]
            for j, key in enumerate(keys):
                x = i + (j - (len(keys) - 1) / 2) * slot
                for offset, part, alpha, name in ((-slot / 4, "first_epoch", 0.45, "first epoch"),
                                                  (slot / 4, "update", 1.0, "all epochs")):
                    axes[1, 1].bar(x + offset, changes[key][part], slot / 2, color=colours[key], alpha=alpha,
                                   label=name if (i, j) == (0, 0) else None)
        axes[1, 1].axhline(0, color="black", lw=0.8)
        axes[1, 1].set_xticks(range(len(tasks)), [t.split("-")[0][:6] for t in tasks])  # Walker, Hopper, Ant
        for ax, title, ylabel in ((axes[0, 0], "advantage by age", "batch std"),
                                  (axes[0, 1], r"$|a - \mu_T| / \sigma_T$ by age", r"mean $|a - \mu_T| / \sigma_T$"),
                                  (axes[1, 0], "entropy", "policy entropy"),
                                  (axes[1, 1], "change per update", "entropy change")):
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.25)
        for ax in axes[0]:
            ax.set_xlabel("snapshot age (updates)")
        axes[1, 0].set_xlabel("update")
        low = min(min(c["first_epoch"], c["update"]) for c in changes.values())
        axes[1, 1].set_ylim(1.7 * low, 0)  # room below the bars for the legend
        axes[1, 1].legend(loc="lower right")
        fig.legend(*axes[1, 0].get_legend_handles_labels(), loc="outside lower center", ncol=1)
    plotting.save(fig, path)


@dataclass
class Args:
    run: bool = False
    """train the runs of RUNS that have no CSV yet (2 at a time), then write the report"""
    jobs: int = 2
    """runs at a time with --run"""
    figures_dir: Optional[str] = None
    """where the figure goes (default: beside the report; the docs take it from docs/img/lag_by_age)"""


def main(args: Args):
    os.makedirs(FOLDER, exist_ok=True)
    if args.run:
        todo = [key for key in RUNS if not os.path.exists(csv_path(*key))]
        with ThreadPoolExecutor(args.jobs) as pool:
            for path in pool.map(lambda key: run(*key), todo):
                print(f"wrote {path}", flush=True)
    path = os.path.join(FOLDER, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(report(args.figures_dir)) + "\n")
    print(f"report: {path}")


if __name__ == "__main__":
    main(tyro.cli(Args))
