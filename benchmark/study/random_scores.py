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

import json
import os
import sys
import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.study.scores import RANDOM_SCORES_FILE, load_runs, ppo_references  # noqa: E402


def random_episode_returns(task, seed=0, action=None):
    """Returns of uniformly random actions, one episode after another (episode i reset with seed + i); with
    `action`, that action at every step instead (zeros: standing still, standing_still.py)."""
    import gymnasium as gym

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(task)
    env.action_space.seed(seed)
    try:
        for episode in range(sys.maxsize):
            env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample() if action is None else action)
                total += reward
                done = terminated or truncated
            yield total
    finally:
        env.close()


def measure_random(task, reference=None, precision=0.01, min_episodes=20, max_episodes=20_000, seed=0):
    """Mean random return of `task`, with episodes added until its standard error is at most
    precision * |reference - mean| (just min_episodes when there is no reference)."""
    returns = []
    with closing(random_episode_returns(task, seed)) as episodes:
        for total in episodes:
            returns.append(total)
            n = len(returns)
            if n >= min_episodes:
                mean, stderr = np.mean(returns), np.std(returns, ddof=1) / np.sqrt(n)
                if reference is None or stderr <= precision * abs(reference - mean) or n >= max_episodes:
                    break
    return {"mean": float(mean), "stderr": float(stderr), "episodes": n, "reference": reference}


def load_random_scores(folder):
    """{task: entry} from the folder's random_scores.json ({} if none). A bare number is a mean
    measured over 20 episodes without a precision target."""
    path = os.path.join(folder, RANDOM_SCORES_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        stored = json.load(f)
    return {task: v if isinstance(v, dict) else {"mean": v, "episodes": 20, "reference": None}
            for task, v in stored.items()}


def random_score_holds(entry, reference, precision):
    """Whether a stored entry meets the precision against this PPO mean."""
    if reference is None:
        return True
    return "stderr" in entry and entry["stderr"] <= precision * abs(reference - entry["mean"])


def update_random_scores(folder, tasks, references, precision=0.01, min_episodes=20):
    """Measure every task of `tasks` whose stored entry is missing or no longer meets the precision;
    write the file when anything changed. Returns {task: entry}."""
    entries = load_random_scores(folder)
    changed = False
    for task in tasks:
        reference = references.get(task)
        if task not in entries or not random_score_holds(entries[task], reference, precision):
            entries[task] = measure_random(task, reference, precision, min_episodes)
            changed = True
            e = entries[task]
            print(f"{task}: random {e['mean']:.2f} ± {e['stderr']:.2f} (standard error, {e['episodes']} episodes)"
                  + (f", PPO {reference:.1f}" if reference is not None else ", no PPO K = 1 run yet"), flush=True)
    if changed:
        with open(os.path.join(folder, RANDOM_SCORES_FILE), "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
    return entries


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
