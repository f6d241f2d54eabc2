"""A folder of study runs (benchmark/study/run.py) read and scored: the final and AUC scores of each run, their
tables by algorithm, K, task and seed, normalised and not, and what the report's sections compute from them.

Scores (per run, from its CSV of per-update episode returns):
- the run is cut into 10 equal slices of env steps; a slice's score is the mean return of the
  episodes that ended in it;
- final = the last slice (the episodes of the last 10% of steps); AUC = the mean over the slices,
  i.e. the normalised area under the learning curve (early learning counts too).
Normalisation per task: (score - random policy) / (PPO K=1 mean - random policy), so 0 is a
uniformly random policy and 1.0 is "as good as synchronous PPO" on that task. The random policy's
return is measured here (uniform actions, seed 0; benchmark/study/random_scores.py) and stored beside the
results in `random_scores.json`.
"""

import csv
import glob
import json
import os
from collections import defaultdict

import numpy as np

SLICES = 10
RANDOM_SCORES_FILE = "random_scores.json"  # beside the runs: the 0 of the normalised scores (random_scores.py)
LAG_HURTS = 0.9  # a task where lag hurts PPO: PPO at the largest K below this share of PPO at K = 1, above random


def load_runs(results_dir):
    """[(meta, rows)] of every finished run (a JSON beside its CSV) in results_dir."""
    runs = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        if os.path.basename(path) == RANDOM_SCORES_FILE:
            continue
        with open(path) as f:
            meta = json.load(f)
        with open(path[: -len(".json")] + ".csv") as f:
            rows = list(csv.DictReader(f))
        runs.append((meta, rows))
    return runs


def slice_scores(rows, total_steps, slices=SLICES):
    """Mean episodic return in each of `slices` equal slices of env steps (NaN where no episode
    ended), from per-update rows holding `step`, `episodes` and `return_mean`."""
    return slice_means(rows, "return_mean", total_steps, slices, weight="episodes")


def slice_means(rows, column, total_steps, slices=SLICES, weight=None):
    """Mean of a logged column in each of `slices` equal slices of env steps (NaN where no row has it), each row
    counted once, or `weight` times (a row's number of episodes, whose mean return it holds)."""
    sums, counts = np.zeros(slices), np.zeros(slices)
    for row in rows:
        n = int(row[weight]) if weight else int(row.get(column, "") != "")
        if n:
            i = min(int((int(row["step"]) - 1) * slices // total_steps), slices - 1)
            sums[i] += float(row[column]) * n
            counts[i] += n
    with np.errstate(invalid="ignore"):
        return sums / counts


def run_scores(meta, rows):
    """{"final": return in the last 10% of steps, "auc": mean over the 10 slices}."""
    scores = slice_scores(rows, meta["total_timesteps"])
    return {"final": scores[-1], "auc": np.nanmean(scores)}


def window_score(rows, end_step):
    """The mean return of the episodes that ended in the last 10% of steps before `end_step` (e.g. 0.9M
    to 1M steps inside a 3M run), whatever the run's length."""
    return slice_scores([row for row in rows if int(row["step"]) <= end_step], end_step)[-1]


def normalise(score, random_score, reference_score):
    """0 = random policy, 1 = the reference (synchronous PPO's mean on the task)."""
    return (score - random_score) / (reference_score - random_score)


def raw_scores(runs):
    """{(algorithm, k): {task: {seed: {"final", "auc"}}}} of the runs' returns."""
    raw = defaultdict(lambda: defaultdict(dict))
    for meta, rows in runs:
        raw[(meta["algorithm"], meta["k"])][meta["task"]][meta["seed"]] = run_scores(meta, rows)
    return raw


def reference_scores(raw):
    """{task: {"final", "auc"}}: synchronous PPO's (K = 1) mean score per task, the 1 of the normalised scores."""
    return {task: {m: float(np.mean([s[m] for s in seeds.values()])) for m in ("final", "auc")}
            for task, seeds in raw.get(("ppo", 1), {}).items()}


def ppo_references(runs):
    """{task: mean final return of PPO at K = 1}, what the random policy's precision is measured against."""
    return {task: scores["final"] for task, scores in reference_scores(raw_scores(runs)).items()}


def score_table(runs, randoms):
    """{(algorithm, k): {task: {seed: {"final", "auc"} normalised}}}, plus raw scores alongside.
    Normalised by PPO K=1's mean score of each metric on the task; tasks without it are skipped."""
    raw = raw_scores(runs)
    reference = reference_scores(raw)
    normalised = defaultdict(lambda: defaultdict(dict))
    for key, tasks in raw.items():
        for task, seeds in tasks.items():
            if task in reference:
                for seed, s in seeds.items():
                    normalised[key][task][seed] = {m: normalise(s[m], randoms[task], reference[task][m])
                                                   for m in ("final", "auc")}
    return raw, normalised


def score_matrix(normalised, key, tasks, metric):
    """(runs x tasks) array for rliable; seeds present on every task only (None if a task lacks it)."""
    if any(task not in normalised.get(key, {}) for task in tasks):
        return None
    seeds = common_seeds(normalised, key, tasks)
    if not seeds:
        return None
    return np.array([[normalised[key][t][s][metric] for t in tasks] for s in seeds])


def common_seeds(scores, key, tasks):
    """The seeds of `key` found on every one of `tasks` in a {key: {task: {seed: ...}}} table (none without tasks)."""
    found = [set(scores.get(key, {}).get(t, {})) for t in tasks]
    return sorted(set.intersection(*found)) if found else []


def on_seeds(scores, key, seeds):
    """The table with `key`'s entries cut to `seeds`, so that every task of a comparison has the same seeds."""
    return {**scores, key: {t: {s: v for s, v in by_seed.items() if s in seeds} for t, by_seed in scores[key].items()}}


def finals(raw, key, task):
    """Final returns of every seed of one algorithm and K on a task."""
    return [s["final"] for s in raw.get(key, {}).get(task, {}).values()]


def above_random_ratio(x, ppo, random):
    """(X - random) / (PPO - random) of mean final returns: > 1 when X is ahead, also on tasks whose returns are
    negative (where a plain ratio of returns would read the other way)."""
    return (np.mean(x) - random) / (np.mean(ppo) - random)


def pairs_won(xs, ys):
    """How many of the pairings (x, y) of two lists of final returns x wins."""
    return sum(x > y for x in xs for y in ys)


def lag_hurt_tasks(raw, randoms, tasks, k):
    """The tasks where lag hurts PPO: its mean final return at K = k > 1 below LAG_HURTS of its mean at
    K = 1, both measured above the random policy (on a task where synchronous PPO is no better than
    random, there is no loss to speak of)."""
    def above_random(key, task):
        return np.mean(finals(raw, key, task)) - randoms[task]

    measured = [t for t in tasks if k > 1 and finals(raw, ("ppo", 1), t) and finals(raw, ("ppo", k), t)]
    return [t for t in measured
            if 0 < above_random(("ppo", 1), t) and above_random(("ppo", k), t) < LAG_HURTS * above_random(("ppo", 1), t)]


def expected_seeds(raw):
    """How many seeds a finished block of the study has: the most that synchronous PPO has on a task."""
    return max((len(seeds) for seeds in raw.get(("ppo", 1), {}).values()), default=0)


def completeness(raw, algorithms, k, tasks, planned=frozenset()):
    """([the algorithms whose runs at K = k are all in, on every one of `tasks`], {algorithm: (runs, runs planned)}
    of those with some of their planned runs in but not all: a block still running, which no table averages).
    Without a plan for it, a block is finished with synchronous PPO's number of seeds on every task; an
    algorithm the presets run on other tasks only (a sweep's variant) is neither."""
    complete, partial = [], {}
    for a in algorithms:
        done = {(t, seed) for t, seeds in raw.get((a, k), {}).items() for seed in seeds}
        plan = {(t, seed) for t, alg, kk, seed in planned if (alg, kk) == (a, k)}
        if not plan:
            n = expected_seeds(raw)
            counts = [len(raw.get((a, k), {}).get(t, {})) for t in tasks]
            finished, planned_count = n > 0 and min(counts) >= n, n * len(tasks)
        else:
            finished, planned_count = plan <= done, len(plan)
        if finished and all(raw.get((a, k), {}).get(t) for t in tasks):
            complete.append(a)
        elif done and not finished:
            partial[a] = (len(done & plan) if plan else len(done), planned_count)
    return complete, partial


def logged_means(runs, key, tasks):
    """Mean over runs (and updates) of the logged lag and filter diagnostics of one algorithm and K on `tasks`."""
    columns = ["backward_tv", "backward_ratio_mean", "backward_ratio_max", "approx_kl", "tv_divergence", "clipfrac",
               "filter_tv", "filtered_fraction", "filter_on_fraction", "entropy", "proximal_tv", "update_tv"]
    values = defaultdict(list)
    for meta, rows in runs:
        if (meta["algorithm"], meta["k"]) == key and meta["task"] in tasks:
            for column in columns:
                col = [float(r[column]) for r in rows if r.get(column, "") != ""]
                if col:
                    values[column].append(np.mean(col))
    return {c: float(np.mean(v)) for c, v in values.items()}
