"""Return against wall-clock time: vaco_async.py (actor processes, real lag) beside the synchronous
vaco_continuous.py --policy-buffer 1, with the same env steps and seeds, one run at a time on this
machine (each run has every core to itself).

For every run it records when it was launched and when it ended, and reads the wall time of each
finished training episode from its TensorBoard log. It reports, per run: wall time, env steps/s,
the final return (mean of the last `--window` episodes), the lag the asynchronous runs ran at, and
the time each run took to reach the synchronous runs' final return (mean over their seeds) with
its rolling mean; and a figure of the rolling mean return against wall-clock minutes.

    python benchmark/asynchrony/wallclock.py --env-id Hopper-v4 --total-timesteps 300000 --seeds 1 2

Finished runs are listed in `<out-dir>/runs.json` with the settings and not run again: run it in
pieces, or rerun it to redo the report only. Nothing else may use the cores meanwhile, or the
times say little.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import FIGURE_WIDTH, FONT, OKABE_ITO, ROOT, pyplot, read_scalars, save_figure  # noqa: E402
DIAGNOSTICS = {"charts/backward_tv": "backward TV", "losses/filter_on_fraction": "filter on",
               "losses/filtered_fraction": "detached", "losses/approx_kl": "approx KL"}


@dataclass
class Args:
    env_id: str = "Hopper-v4"
    """the MuJoCo task"""
    total_timesteps: int = 300000
    """env steps of every run"""
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    """seeds; each one runs both scripts"""
    num_actors: int = 2
    """actor processes of vaco_async.py"""
    extra: str = ""
    """extra flags passed to both scripts"""
    window: int = 100
    """episodes in the rolling mean (and in the final return)"""
    out_dir: str = "runs/async_wallclock"
    """where the runs (TensorBoard logs, outputs), runs.json, wallclock.md and wallclock.png go"""


def commands(args):
    """{name: command line (without --seed)} of the two scripts compared."""
    common = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps), *shlex.split(args.extra)]
    return {
        "sync": [sys.executable, os.path.join(ROOT, "vaco_continuous.py"), "--policy-buffer", "1", *common],
        "async": [sys.executable, os.path.join(ROOT, "vaco_async.py"), "--num-actors", str(args.num_actors), *common],
    }


def run_once(name, command, seed, out_dir):
    """Run one training run in `out_dir` (its runs/ folder), its output to logs/; returns its record."""
    exp_name = f"{name}-wallclock"
    log = os.path.join(out_dir, "logs", f"{exp_name}__{seed}.txt")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    before = set(os.listdir(os.path.join(out_dir, "runs"))) if os.path.isdir(os.path.join(out_dir, "runs")) else set()
    start = time.time()
    with open(log, "w") as out:
        subprocess.run([*command, "--seed", str(seed), "--exp-name", exp_name], cwd=out_dir, stdout=out,
                       stderr=subprocess.STDOUT, check=True)
    end = time.time()
    (run_dir,) = set(os.listdir(os.path.join(out_dir, "runs"))) - before
    return {"name": name, "seed": seed, "start": start, "end": end, "run_dir": os.path.join("runs", run_dir)}


def rolling_mean(values, window):
    """Trailing mean over `window` values, defined from the window-th value on."""
    if len(values) < window:
        return np.array([])
    sums = np.cumsum(np.insert(values, 0, 0.0))
    return (sums[window:] - sums[:-window]) / window


def analyse(records, args):
    """Per run: minutes, SPS, final return, lag, and the rolling-mean curve against minutes."""
    out = []
    for record in records:
        run_dir = os.path.join(args.out_dir, record["run_dir"])
        values, wall_times = read_scalars(run_dir), read_scalars(run_dir, "wall_time")
        series = lambda tag: np.array(values.get(tag, []))  # noqa: E731
        times, returns = np.array(wall_times.get("charts/episodic_return", [])), series("charts/episodic_return")
        lag_mean, lag_max = series("charts/policy_lag_mean"), series("charts/policy_lag_max")
        curve = rolling_mean(returns, args.window)
        # how the lag shows in the update: means over the run's updates
        diagnostics = {tag: float(np.mean(series(tag))) for tag in DIAGNOSTICS}
        out.append({**record, **diagnostics, "minutes": (record["end"] - record["start"]) / 60,
                    "sps": args.total_timesteps / (record["end"] - record["start"]),
                    "final": float(returns[-args.window:].mean()), "lag_mean": float(lag_mean.mean()),
                    "lag_max": float(lag_max.max()),
                    "curve_minutes": (times[args.window - 1:] - record["start"]) / 60, "curve": curve})
    return out


def report(runs, args):
    """Markdown table; the target is the synchronous runs' mean final return."""
    target = np.mean([r["final"] for r in runs if r["name"] == "sync"])
    lines = [f"{args.env_id}, {args.total_timesteps:,} env steps per run, one run at a time. Final return: mean of "
             f"the last {args.window} training episodes. Time to target: first time the rolling mean of "
             f"{args.window} episodes reaches the synchronous runs' mean final return, {target:.0f}. The last four "
             "columns are means over the run's updates: TV(pi_T, beta) at the update's start, the share of "
             "minibatches with the filter on, of samples detached, and the approximate KL of an update.", "",
             "| run | seed | wall time (min) | env steps/s | final return | lag mean / max (versions) "
             "| time to target (min) | " + " | ".join(DIAGNOSTICS.values()) + " |", "|-|-|-|-|-|-|-|-|-|-|-|"]
    to_target = {}
    for r in sorted(runs, key=lambda r: (r["name"] != "sync", r["seed"])):
        reached = np.flatnonzero(r["curve"] >= target)
        to_target[r["name"], r["seed"]] = r["curve_minutes"][reached[0]] if len(reached) else np.inf
        shown = f"{to_target[r['name'], r['seed']]:.1f}" if len(reached) else "not reached"
        lines.append(f"| {r['name']} | {r['seed']} | {r['minutes']:.1f} | {r['sps']:.0f} | {r['final']:.0f} | "
                     f"{r['lag_mean']:.2f} / {r['lag_max']:.0f} | {shown} | "
                     + " | ".join(f"{r[tag]:.3f}" for tag in DIAGNOSTICS) + " |")
    sync, fast = [r for r in runs if r["name"] == "sync"], [r for r in runs if r["name"] == "async"]
    if sync and fast:
        reach = np.median([to_target["async", r["seed"]] for r in fast])
        wall = np.median([r["minutes"] for r in sync])
        low, high = min(r["final"] for r in sync), max(r["final"] for r in sync)
        inside = sum(low <= r["final"] <= high for r in fast)
        reached = sum(np.isfinite(to_target["async", r["seed"]]) for r in fast)
        timing = (f"Median over seeds: the asynchronous runs reach the target in {reach:.1f} min, against the "
                  f"synchronous runs' wall time of {wall:.1f} min ({reach / wall:.2f} of it)" if np.isfinite(reach) else
                  f"The median asynchronous run does not reach the target ({reached} of {len(fast)} do); the "
                  f"synchronous runs' median wall time is {wall:.1f} min")
        lines += ["", f"{timing}. Final returns: "
                  f"asynchronous mean {np.mean([r['final'] for r in fast]):.0f} (median "
                  f"{np.median([r['final'] for r in fast]):.0f}), synchronous mean {target:.0f} (median "
                  f"{np.median([r['final'] for r in sync]):.0f}); {inside} of {len(fast)} asynchronous runs end inside "
                  f"the synchronous runs' range, {low:.0f} to {high:.0f}."]
    return "\n".join(lines)


def plot(runs, args, path):
    """Return against wall-clock minutes, one line per seed, in every benchmark's figure look (benchmark/common.py:
    fonts a phone can read, Okabe and Ito's colours)."""
    plt = pyplot()
    colours = {"sync": OKABE_ITO["blue"], "async": OKABE_ITO["vermillion"]}
    labels = {"sync": "vaco_continuous.py --policy-buffer 1", "async": f"vaco_async.py --num-actors {args.num_actors}"}
    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 5.2), layout="constrained")
        for name in colours:
            mine = [r for r in runs if r["name"] == name]
            for i, r in enumerate(mine):  # one line per seed, one legend entry per script
                ax.plot(r["curve_minutes"], r["curve"], color=colours[name], alpha=0.8, lw=1.6,
                        ls="-" if name == "sync" else "--", label=f"{labels[name]} ({len(mine)} seeds)" if i == 0 else None)
        ax.set_xlabel("wall-clock minutes")
        ax.set_ylabel(f"return (rolling mean\nof {args.window} episodes)")
        ax.set_title(f"{args.env_id}, {args.total_timesteps:,} env steps per run")
        ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=1)
        save_figure(fig, path)


def main(args: Args):
    os.makedirs(args.out_dir, exist_ok=True)
    manifest = os.path.join(args.out_dir, "runs.json")
    settings = {key: getattr(args, key) for key in ("env_id", "total_timesteps", "num_actors", "extra", "window")}
    records = []
    if os.path.exists(manifest):
        with open(manifest) as f:
            saved = json.load(f)
        if saved["settings"] != settings:
            sys.exit(f"error: {args.out_dir} holds runs made with {saved['settings']}; choose another --out-dir")
        records = saved["runs"]
    done = {(r["name"], r["seed"]) for r in records}
    for seed in args.seeds:
        for name, command in commands(args).items():
            if (name, seed) in done:
                continue
            print(f"running {name} seed {seed} ...", flush=True)
            records.append(run_once(name, command, seed, args.out_dir))
            with open(manifest, "w") as f:  # after every run: an interrupted study keeps what it finished
                json.dump({"settings": settings, "runs": records}, f, indent=1)
            print(f"  {(records[-1]['end'] - records[-1]['start']) / 60:.1f} min", flush=True)
    runs = analyse(records, args)
    table = report(runs, args)
    with open(os.path.join(args.out_dir, "wallclock.md"), "w") as f:
        f.write(table + "\n")
    plot(runs, args, os.path.join(args.out_dir, "wallclock.png"))
    print(table)


if __name__ == "__main__":
    main(tyro.cli(Args))
