"""Random-policy returns, the 0 of the study's normalised scores, measured per task and stored beside
the results as random_scores.json.

    python benchmark/study/random_scores.py benchmark/results/ten-tasks

A uniformly random policy (actions drawn from the action space, seeded 0; episode i reset with seed i)
plays episodes of each task that the folder's runs trained on, until the standard error of its mean
return is under --precision (1 %) of the task's range: synchronous PPO's mean final return in the
folder (PPO at K = 1, the 1 of the normalised scores) minus the random mean. A task without a
finished PPO K = 1 run gets --min-episodes episodes, and is measured again on a later call once it
has one. Each task's entry records its mean, standard error, episode count and the PPO mean it was
held to; a rerun measures again only where that precision no longer holds (the same episodes, more of
them: the measurement is deterministic).
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.study.analyze import load_runs, ppo_references, update_random_scores  # noqa: E402


@dataclass
class Args:
    results_dir: tyro.conf.Positional[str]
    """a folder of study results (CSV + JSON per run), e.g. benchmark/results/ten-tasks"""
    precision: float = 0.01
    """the standard error of the random mean, as a fraction of the task's PPO-minus-random range"""
    min_episodes: int = 20
    """episodes at least, and all a task gets before it has a PPO K = 1 run"""


def main(args: Args):
    if not os.path.isdir(args.results_dir):
        sys.exit(f"error: {args.results_dir} is not a folder")
    if not 0 < args.precision < 1 or args.min_episodes < 2:
        sys.exit("error: need 0 < --precision < 1 and --min-episodes >= 2")
    runs = load_runs(args.results_dir)
    tasks = sorted({meta["task"] for meta, _ in runs})
    if not tasks:
        sys.exit(f"error: no finished runs (JSON + CSV) in {args.results_dir}")
    update_random_scores(args.results_dir, tasks, ppo_references(runs), args.precision, args.min_episodes)


if __name__ == "__main__":
    main(tyro.cli(Args))
