"""Throughput of the training scripts against the physical limit: the raw environment.

For each repeat it measures, in this one process and run, the raw step rate of a single
`gym.make(env_id)` env driven with random actions, then runs each script with the same batch and
update settings (by default CleanRL's ppo_continuous_action: 1 env, 2048 steps, 32 minibatches,
10 epochs) and reads its steady env steps/s from its TensorBoard log (from the end of the first
update to the end of the last: start-up and the one-off compile left out). Medians over repeats;
ratios are what to compare across machines. With --whole-run it reads instead the last `SPS:` each script
prints, its rate over the whole run from its start (CleanRL's and ours count the same way), the first update
included: then a first repeat, not counted, warms the compile cache as a user's second run finds it.

    python benchmark/speed/sps.py --env-id Ant-v4 --scripts ppo_continuous.py vaco_continuous.py

A script entry may carry its own flags, e.g. the asynchronous script with 1 and 2 actor processes
at the synchronous scripts' defaults (8 envs x 256 steps, split across the actors):

    python benchmark/speed/sps.py --env-id Ant-v4 --num-envs 8 --num-steps 256 \\
        --scripts vaco_continuous.py "vaco_async.py --num-actors 1" "vaco_async.py --num-actors 2"

For vaco_async.py it also reports the share of time the learner waited for data and the actors
waited for replies (medians). Acting and learning overlap only where the cores really run in
parallel, so each repeat also measures the machine's parallel capacity: the summed rate of 2 bare
envs stepping at the same time, over the rate of one (2.0 on two free cores; a VM whose two
vCPUs share one physical core gives about 1). CleanRL's own ppo_continuous_action.py (github.com/vwxyzjn/cleanrl), given by path, is timed beside
them with --cleanrl: it takes the same flags, and runs from a temporary copy patched for gymnasium 1.x
(the two places listed in CLEANRL_PATCHES, nothing else):

    python benchmark/speed/sps.py --env-id Ant-v4 --scripts ppo_continuous.py "ppo_continuous.py --no-compile" \
        --cleanrl ~/cleanrl/cleanrl/ppo_continuous_action.py

Any other script outside the repository can be timed too (an absolute path), with the Python that runs
it first (another virtual environment's, say).
"""

import multiprocessing
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import gymnasium as gym
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT, tensorboard_log  # noqa: E402


@dataclass
class Args:
    env_id: str = "Ant-v4"
    """the MuJoCo task"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous.py"])
    """training scripts to time, each optionally with its own flags ("vaco_async.py --num-actors 2"),
    relative to the repository root or absolute; ratios are against the first"""
    num_envs: int = 1
    """envs of every script (vaco_async.py: in total, across its actors)"""
    num_steps: int = 2048
    """steps per env per update (vaco_async.py: per segment)"""
    iterations: int = 5
    """updates per timed run (num_envs x num_steps env steps each)"""
    raw_steps: int = 10000
    """env steps of each raw-rate measurement"""
    repeats: int = 3
    """repeats; medians are reported"""
    extra: str = ""
    """extra flags passed to every script, e.g. "--policy-buffer 8" """
    cleanrl: Optional[str] = None
    """path to CleanRL's ppo_continuous_action.py, timed after the scripts (from a copy patched for gymnasium 1.x)"""
    whole_run: bool = False
    """time whole runs, as each script prints its `SPS:` at the end (first update and compile included, after a
    warm-up repeat), instead of the steady rate from the end of the first update"""


# CleanRL's ppo_continuous_action.py targets gymnasium 0.29. What gymnasium 1.x changed under it, and only that,
# is patched in a temporary copy: (what it says, what it says instead).
CLEANRL_PATCHES = [
    # TransformObservation takes the observation space it maps to
    ("gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))",
     "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)"),
    # the vector env reports the episodes that ended as arrays under "episode", with a mask, not in "final_info"
    ("""            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                        writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
                        writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)""",
     """            if "episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    print(f"global_step={global_step}, episodic_return={infos['episode']['r'][i]}")
                    writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)"""),
]


def patched_cleanrl(path, folder):
    """CleanRL's script at `path`, with CLEANRL_PATCHES applied, written into `folder`; returns the copy's path."""
    try:
        with open(os.path.expanduser(path)) as f:
            source = f.read()
    except OSError as error:
        sys.exit(f"error: --cleanrl {path}: {error.strerror}")
    for old, new in CLEANRL_PATCHES:
        if source.count(old) != 1:
            sys.exit(f"error: --cleanrl {path}: not the ppo_continuous_action.py this patch knows "
                     f"(no single '{old.strip().splitlines()[0]}')")
        source = source.replace(old, new)
    copy = os.path.join(folder, "ppo_continuous_action.py")
    with open(copy, "w") as f:
        f.write(source)
    return copy


def raw_env_rate(env_id, steps, seed=0):
    """Steps per second of one bare env with random actions (resets included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def parallel_env_rate(env_id, steps, processes=2):
    """Summed steps per second of `processes` bare envs stepping at the same time, in processes
    of their own (each measures only its stepping loop, after its imports)."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.starmap(raw_env_rate, [(env_id, steps, seed) for seed in range(processes)]))


def steady_rate(run_dir):
    """Env steps per second from the end of the first update to the end of the last, read from
    the run's TensorBoard log (charts/SPS is logged once per update): start-up, the first rollout
    and the one-off compile of the update are left out."""
    events = tensorboard_log(run_dir).Scalars("charts/SPS")
    return (events[-1].step - events[0].step) / (events[-1].wall_time - events[0].wall_time)


def script_sps(entry, args):
    """(the steady env steps/s of a short training run of `entry`, and the learner's and actors'
    shares of time spent waiting when it reports them, else None). An entry may start with the
    Python that runs it (e.g. another virtual environment's, for a reference script)."""
    words = shlex.split(entry)
    python = words.pop(0) if not words[0].endswith(".py") else sys.executable
    script, *own_flags = words
    cmd = [python, os.path.join(ROOT, script), "--env-id", args.env_id, "--num-envs", str(args.num_envs),
           "--num-steps", str(args.num_steps), "--num-minibatches", "32", "--update-epochs", "10",
           "--total-timesteps", str(args.num_envs * args.num_steps * args.iterations), *shlex.split(args.extra),
           *own_flags]
    with tempfile.TemporaryDirectory() as tmp:  # its runs/ folder is thrown away
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=True).stdout
        (run_dir,) = [os.path.join(tmp, "runs", d) for d in os.listdir(os.path.join(tmp, "runs"))]
        rate = int(re.findall(r"SPS: (\d+)", out)[-1]) if args.whole_run else steady_rate(run_dir)
    waits = re.search(r"waiting: learner (\d+)%.*, actors (\d+)%", out)
    return rate, waits and tuple(int(w) for w in waits.groups())


def main(args: Args):
    labels = {entry: entry for entry in args.scripts}
    if args.cleanrl:
        labels[patched_cleanrl(args.cleanrl, tempfile.mkdtemp())] = "CleanRL ppo_continuous_action.py"
        args.scripts = list(labels)
    raw, capacity = [], []
    sps, waits = {entry: [] for entry in args.scripts}, {entry: [] for entry in args.scripts}
    if args.whole_run:  # a warm-up repeat, not counted: the compile cache as a second run finds it
        for entry in args.scripts:
            script_sps(entry, args)
    for repeat in range(args.repeats):
        raw.append(raw_env_rate(args.env_id, args.raw_steps, seed=repeat))
        capacity.append(parallel_env_rate(args.env_id, args.raw_steps) / raw[-1])
        for entry in args.scripts:
            rate, waited = script_sps(entry, args)
            sps[entry].append(round(rate))
            if waited:
                waits[entry].append(waited)
        print(f"repeat {repeat + 1}/{args.repeats}: raw {raw[-1]:.0f} steps/s (parallel capacity "
              f"{capacity[-1]:.2f}), "
              + ", ".join(f"{labels[s]} {v[-1]} SPS" for s, v in sps.items()), flush=True)
    raw_median = statistics.median(raw)
    width = max(24, *(len(label) for label in labels.values()))
    print(f"\n{args.env_id}, {args.num_envs} env(s) x {args.num_steps} steps, 32 minibatches x 10 epochs, "
          f"{args.iterations} updates, {'whole runs' if args.whole_run else 'steady rates'}, medians of "
          f"{args.repeats} {args.extra}")
    print(f"{'':{width}s} {'SPS':>7s} {'/ raw env':>10s} {'/ ' + labels[args.scripts[0]]:>{width}s}  waiting: learner, actors")
    print("(the ratios: medians over repeats of each repeat's ratio, the rates of one repeat measured together)")
    print(f"{'raw env (random actions)':{width}s} {raw_median:7.0f} {1.0:10.2f}")
    print(f"parallel capacity (2 envs at once / 1): median {statistics.median(capacity):.2f}, "
          f"range {min(capacity):.2f}-{max(capacity):.2f}")
    for entry, values in sps.items():
        median = statistics.median(values)
        # against the raw env timed in the same repeat: a ratio within one repeat cancels the machine's drift between
        # repeats, which a ratio of the medians would carry
        of_raw = statistics.median(v / r for v, r in zip(values, raw))
        of_first = statistics.median(v / f for v, f in zip(values, sps[args.scripts[0]]))
        waited = ""
        if waits[entry]:
            waited = "  " + ", ".join(f"{statistics.median(column):.0f}%" for column in zip(*waits[entry]))
        print(f"{labels[entry]:{width}s} {median:7.0f} {of_raw:10.2f} {of_first:{width}.2f}{waited}")


if __name__ == "__main__":
    main(tyro.cli(Args))
