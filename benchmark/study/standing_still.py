"""What a policy that does nothing scores: the return of the zero action (no torque on any joint) at every step,
per task, measured the way random_scores.py measures a random policy (the same episodes: episode i reset with seed
i). On a task that pays a reward for staying healthy, standing still collects it: the floor a learned gait has to
clear, and what a return is to be read against.

    python benchmark/study/standing_still.py                                  # Ant-v4, 10 episodes
    python benchmark/study/standing_still.py --tasks Ant-v4 Hopper-v4 --episodes 20

Writes benchmark/results/standing_still.md (--out): per task the mean return with its 95 % Student-t interval over
the episodes, their standard deviation, the lowest and highest. The measurement is deterministic: a rerun writes the
same file.
"""

import itertools
import os
import sys
import warnings
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT, t_interval, write_atomic  # noqa: E402
from benchmark.study.random_scores import random_episode_returns  # noqa: E402


def standing_still(task, episodes=10):
    """The returns of `episodes` episodes of the zero action on `task`."""
    import gymnasium as gym

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(task)
    shape = env.action_space.shape
    env.close()
    with closing(random_episode_returns(task, action=np.zeros(shape, dtype=np.float32))) as returns:
        return list(itertools.islice(returns, episodes))


def report(results):
    """The report's Markdown: a row a task."""
    lines = ["# Standing still: the return of the zero action", "",
             "What a policy that does nothing scores: no torque on any joint at every step, each episode to its end "
             "(termination or the task's time limit), episode i reset with seed i, as `random_scores.py` plays its "
             "random policy. Written by `python benchmark/study/standing_still.py`.", "",
             "<!-- --8<-- [start:standing_still] -->",
             "| task | mean return [95 % interval] | std | lowest | highest | episodes |", "|-|-|-|-|-|-|"]
    for task, returns in results.items():
        mean, (low, high) = t_interval(returns)
        lines.append(f"| {task} | {mean:.0f} [{low:.0f}, {high:.0f}] | {np.std(returns, ddof=1):.1f} | "
                     f"{min(returns):.0f} | {max(returns):.0f} | {len(returns)} |")
    lines += ["<!-- --8<-- [end:standing_still] -->", ""]
    return "\n".join(lines)


@dataclass
class Args:
    tasks: list[str] = field(default_factory=lambda: ["Ant-v4"])
    """the tasks to measure"""
    episodes: int = 10
    """episodes per task"""
    out: str = os.path.join(ROOT, "benchmark", "results", "standing_still.md")
    """the report to write"""


def main(args: Args):
    if args.episodes < 2:
        sys.exit("error: --episodes must be at least 2 (an interval needs two)")
    results = {task: standing_still(task, args.episodes) for task in args.tasks}
    write_atomic(args.out, report(results))
    for task, returns in results.items():
        print(f"{task}: standing still {np.mean(returns):.1f} (mean of {len(returns)} episodes)")
    print(f"report: {args.out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
