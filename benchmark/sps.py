"""Throughput of the training scripts against the physical limit: the raw environment.

For each repeat it measures, in this one process and run, the raw step rate of a single
`gym.make(env_id)` env driven with random actions, then runs each script with CleanRL's
ppo_continuous_action settings (1 env, 2048 steps, 32 minibatches, 10 epochs) and reads the last
`SPS: <n>` it prints. Medians over repeats; ratios are what to compare across machines.

    python benchmark/sps.py --env-id Ant-v4 --scripts ppo_continuous.py vaco_continuous.py

A script outside the repository can be timed too (an absolute path), e.g. CleanRL's
ppo_continuous_action.py as a same-machine reference: it takes the same flags.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import gymnasium as gym
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Args:
    env_id: str = "Ant-v4"
    """the MuJoCo task"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous.py"])
    """training scripts to time (relative to the repository root, or absolute); ratios are against the first"""
    iterations: int = 5
    """updates per timed run (2048 env steps each)"""
    raw_steps: int = 10000
    """env steps of each raw-rate measurement"""
    repeats: int = 3
    """repeats; medians are reported"""
    extra: str = ""
    """extra flags passed to every script, e.g. "--policy-buffer 8" """


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


def script_sps(script, env_id, iterations, extra):
    """The last `SPS: <n>` a short training run of `script` prints."""
    cmd = [sys.executable, os.path.join(ROOT, script), "--env-id", env_id, "--num-envs", "1",
           "--num-steps", "2048", "--num-minibatches", "32", "--update-epochs", "10",
           "--total-timesteps", str(2048 * iterations), *extra.split()]
    with tempfile.TemporaryDirectory() as tmp:  # its runs/ folder is thrown away
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=True).stdout
    return int(re.findall(r"SPS: (\d+)", out)[-1])


def main(args: Args):
    raw, sps = [], {script: [] for script in args.scripts}
    for repeat in range(args.repeats):
        raw.append(raw_env_rate(args.env_id, args.raw_steps, seed=repeat))
        for script in args.scripts:
            sps[script].append(script_sps(script, args.env_id, args.iterations, args.extra))
        print(f"repeat {repeat + 1}/{args.repeats}: raw {raw[-1]:.0f} steps/s, "
              + ", ".join(f"{s} {v[-1]} SPS" for s, v in sps.items()), flush=True)
    raw_median = statistics.median(raw)
    first = statistics.median(sps[args.scripts[0]])
    print(f"\n{args.env_id}, 1 env x 2048 steps, 32 minibatches x 10 epochs, {args.iterations} updates, "
          f"medians of {args.repeats} {args.extra}")
    print(f"{'':24s} {'SPS':>7s} {'/ raw env':>10s} {'/ ' + args.scripts[0]:>24s}")
    print(f"{'raw env (random actions)':24s} {raw_median:7.0f} {1.0:10.2f}")
    for script, values in sps.items():
        median = statistics.median(values)
        print(f"{script:24s} {median:7.0f} {median / raw_median:10.2f} {median / first:24.2f}")


if __name__ == "__main__":
    main(tyro.cli(Args))
