"""Analysis of a lag-robustness study (benchmark/study/run.py): normalised scores, rliable aggregates with
stratified-bootstrap intervals, probability of improvement, a Markdown report and figures.

    python benchmark/study/analyze.py benchmark/results/cpu
    python benchmark/study/analyze.py benchmark/results/cpu --figures-dir docs/img/study_cpu

Scores (per run, from its CSV of per-update episode returns):
- the run is cut into 10 equal slices of env steps; a slice's score is the mean return of the
  episodes that ended in it;
- final = the last slice (the episodes of the last 10% of steps); AUC = the mean over the slices,
  i.e. the normalised area under the learning curve (early learning counts too).
Normalisation per task: (score - random policy) / (PPO K=1 mean - random policy), so 0 is a
uniformly random policy and 1.0 is "as good as synchronous PPO" on that task. The random policy's
return is measured here (uniform actions, seed 0; benchmark/study/random_scores.py) and stored beside the
results in `random_scores.json`.

Aggregates (rliable): median, IQM, mean and optimality gap over all runs x tasks, with 95%
stratified-bootstrap percentile intervals (resampling seeds within each task). The bootstrap is
seeded, so the same CSVs always give the same intervals.
"""

import csv
import glob
import json
import os
import sys
import warnings
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.study.run import DELTAS, FOLDERS, PRESETS, grid  # noqa: E402

SLICES = 10
METRICS = ["Median", "IQM", "Mean", "Optimality Gap"]
MAIN_ALGORITHMS = ["ppo", "ppo-kl", "spo", "vaco", "vaco-noalign", "vaco-nofilter", "vaco-none", "ppo-decoupled"]
# the methods whose share of PPO's lag loss is measured, and their names in the report
RECOVERERS = {"vaco": "VACO", "vaco-proximal-0.1": "VACO against π_T", "ppo-decoupled": "decoupled PPO",
              "vtrace-decoupled": "V-trace + decoupled clip", "geppo": "GePPO", "geppo-gae": "GePPO with GAE"}
# what each of them is made of: (advantages, trust region); PPO's for comparison
PARTS = {"ppo": ("GAE", "PPO's clip on π_θ/β"), "vaco": ("V-trace", "TV filter against β"),
         "vaco-proximal-0.1": ("V-trace", "TV filter against π_T"),
         "ppo-decoupled": ("GAE", "decoupled clip: π_θ/π_T, weight π_T/β"),
         "vtrace-decoupled": ("V-trace", "decoupled clip: π_θ/π_T, weight π_T/β"),
         "geppo": ("V-trace", "GePPO's band around π_T/β, adaptive actor rate"),
         "geppo-gae": ("GAE", "GePPO's band around π_T/β, adaptive actor rate")}
# one variable at a time: (what changes, [(from, to)]) between methods that differ in that part only
ONE_VARIABLE = [("the advantages, GAE → V-trace", [("ppo-decoupled", "vtrace-decoupled"), ("geppo-gae", "geppo")]),
                ("the trust region, all with V-trace", [("vtrace-decoupled", "vaco"), ("vtrace-decoupled", "vaco-proximal-0.1"),
                                                        ("vtrace-decoupled", "geppo"), ("vaco", "vaco-proximal-0.1"),
                                                        ("vaco-proximal-0.1", "geppo"), ("vaco", "geppo")])]
CLEARLY_BEHIND = 2 / 9  # a method is clearly behind PPO on a task where it wins at most this share of the seed pairs
LAG_HURTS = 0.9  # a task where lag hurts PPO: PPO at the largest K below this share of PPO at K = 1, above random


# --- loading and scoring ------------------------------------------------------------------------

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
    sums, counts = np.zeros(slices), np.zeros(slices)
    for row in rows:
        episodes = int(row["episodes"])
        if episodes:
            i = min(int((int(row["step"]) - 1) * slices // total_steps), slices - 1)
            sums[i] += float(row["return_mean"]) * episodes
            counts[i] += episodes
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
    seeds = sorted(set.intersection(*(set(normalised[key][t]) for t in tasks)))
    if not seeds:
        return None
    return np.array([[normalised[key][t][s][metric] for t in tasks] for s in seeds])


# --- random-policy scores -----------------------------------------------------------------------
# the 0 of the normalised scores, kept beside the results; its command line: random_scores.py

RANDOM_SCORES_FILE = "random_scores.json"


def random_episode_returns(task, seed=0):
    """Returns of uniformly random actions, one episode after another (episode i reset with seed + i)."""
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
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
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


# --- aggregates ---------------------------------------------------------------------------------

def each_seeded(estimate, entries, reps, seed):
    """rliable's interval estimates of `estimate` for each entry, each from the bootstrap seeded with `seed`
    (rliable draws from numpy's global generator): an entry's interval is the same whichever others a
    section computes beside it."""
    from rliable import library as rly

    points, intervals = {}, {}
    for name, entry in entries.items():
        np.random.seed(seed)
        point, interval = rly.get_interval_estimates({name: entry}, estimate, reps=reps)
        points.update(point)
        intervals.update(interval)
    return points, intervals


def aggregates(matrices, reps, seed):
    """rliable point estimates and 95% intervals of METRICS for each entry of `matrices`."""
    from rliable import metrics

    def fn(x):
        return np.array([metrics.aggregate_median(x), metrics.aggregate_iqm(x), metrics.aggregate_mean(x),
                         metrics.aggregate_optimality_gap(x)])

    return each_seeded(fn, matrices, reps, seed)


def probability_of_improvement(pairs, reps, seed):
    """P(X > Y) with 95% intervals for each {"X,Y": (scores_x, scores_y)}."""
    from rliable import metrics

    return each_seeded(metrics.probability_of_improvement, pairs, reps, seed)


def diagnostics(runs, key, tasks):
    """Mean over runs (and updates) of the logged lag and filter diagnostics."""
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


# --- report -------------------------------------------------------------------------------------

def marked(name, lines):
    """Lines between snippet markers, so that a docs page can include them (pymdownx.snippets)."""
    return [f"<!-- --8<-- [start:{name}] -->", *lines, f"<!-- --8<-- [end:{name}] -->", ""] if lines else []


def fmt_interval(point, interval):
    return f"{point:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def titled(title, name, lines):
    """A heading, then `lines` between snippet markers: the heading stays outside them, since a page
    that includes the section has its own (a heading inside would repeat in the page's contents)."""
    return [f"### {title}", "", *marked(name, lines)] if lines else []


def aggregate_section(normalised, keys, tasks, metric, reps, seed):
    """A Markdown table of the aggregates of `keys` on `tasks`, and the estimates for plotting."""
    matrices = {f"{a} K={k}": m for a, k in keys if (m := score_matrix(normalised, (a, k), tasks, metric)) is not None}
    if not matrices:
        return [], {}, {}
    points, intervals = aggregates(matrices, reps, seed)
    lines = [f"Tasks: {', '.join(tasks)}. Normalised {metric} score; 95% stratified-bootstrap "
             f"intervals ({reps} resamples).", "",
             "| algorithm | K | seeds | " + " | ".join(METRICS) + " |", "|-|-|-|" + "-|" * len(METRICS)]
    for name, m in matrices.items():
        algorithm, k = name.rsplit(" K=", 1)
        cells = [fmt_interval(points[name][i], intervals[name][:, i]) for i in range(len(METRICS))]
        lines.append(f"| {algorithm} | {k} | {m.shape[0]} | " + " | ".join(cells) + " |")
    return lines + [""], points, intervals


def raw_section(raw, keys, tasks):
    """Per-task final returns, mean ± sample standard deviation over seeds (n)."""
    lines = ["| algorithm | K | " + " | ".join(tasks) + " |", "|-|-|" + "-|" * len(tasks)]
    for key in keys:
        cells = []
        for task in tasks:
            finals = [s["final"] for s in raw.get(key, {}).get(task, {}).values()]
            spread = f" ± {np.std(finals, ddof=1):.0f}" if len(finals) > 1 else ""
            cells.append(f"{np.mean(finals):.0f}{spread} ({len(finals)})" if finals else "")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return lines + [""]


def t_interval(values):
    """Mean and 95% Student-t interval of the mean over seeds (n - 1 degrees of freedom)."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = values.mean()
    if len(values) < 2:
        return mean, (np.nan, np.nan)
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, (mean - half, mean + half)


def finals(raw, key, task):
    """Final returns of every seed of one algorithm and K on a task."""
    return [s["final"] for s in raw.get(key, {}).get(task, {}).values()]


def above_random_ratio(vaco, ppo, random):
    """(VACO - random) / (PPO - random) of mean final returns: > 1 when VACO is ahead, also on tasks
    whose returns are negative (where a plain ratio of returns would read the other way)."""
    return (np.mean(vaco) - random) / (np.mean(ppo) - random)


def interval_cell(values):
    """Mean and 95% t-interval of a list of final returns ("" if none; one seed has no interval)."""
    if not values:
        return ""
    mean, (lo, hi) = t_interval(values)
    return f"{mean:.0f} (1 seed)" if len(values) == 1 else f"{mean:.0f} [{lo:.0f}, {hi:.0f}]"


def comparison_section(raw, randoms, tasks, ks, planned=frozenset()):
    """Per task: PPO's and VACO's final return (mean and 95% t-interval over seeds) at each K, and
    their ratio above the random policy; the other methods under lag too, at the K where they ran,
    except a block still running (listed as incomplete below the table)."""
    running = {k: completeness(raw, [a for a in RECOVERERS if (a, k) in raw], k, tasks, planned)[1] for k in ks}
    others = {k: [a for a in RECOVERERS if a == "vaco" or ((a, k) in raw and a not in running[k])] for k in ks}
    header = ["task"]
    for k in ks:
        header += [f"PPO K={k}"] + [f"{RECOVERERS[a]}{suffix} K={k}" for a in others[k] for suffix in ("", "/PPO")]
    x = "X" if any(len(names) > 1 for names in others.values()) else "VACO"
    lines = ["Final return (the episodes of the last 10% of steps): mean over seeds and its 95% Student-t "
             f"interval; {x}/PPO = ({x} − random) / (PPO − random) at the same K, above 1 when {x} is ahead.", "",
             "| " + " | ".join(header) + " |", "|" + "-|" * len(header)]
    for task in tasks:
        cells = []
        for k in ks:
            ppo = finals(raw, ("ppo", k), task)
            cells.append(interval_cell(ppo))
            for algorithm in others[k]:
                other = finals(raw, (algorithm, k), task)
                cells += [interval_cell(other),
                          f"{above_random_ratio(other, ppo, randoms[task]):.2f}" if ppo and other else ""]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines + [""] + [line for k in ks for line in incomplete_line(running[k], k)]


def relative_improvement(raw, randoms, tasks, k, reps, seed):
    """VACO's relative improvement over PPO at one K, over tasks, three ways, with 95% stratified-bootstrap
    intervals (each task's seeds resampled, per algorithm): the paper's, the mean over tasks of
    (VACO - PPO) / |PPO| of the per-task mean final returns; the median over tasks of that same per-task
    number, which one task far ahead cannot carry; and the mean over tasks "above random",
    (VACO - PPO) / (PPO - random), i.e. VACO/PPO above random - 1."""
    pairs = [(np.array(finals(raw, ("vaco", k), t)), np.array(finals(raw, ("ppo", k), t)), randoms[t]) for t in tasks]

    def improvements(means):
        paper = [(v - p) / abs(p) for v, p, _ in means]
        shifted = [(v - p) / (p - r) for v, p, r in means]
        return np.array([np.mean(paper), np.median(paper), np.mean(shifted)])

    point = improvements([(v.mean(), p.mean(), r) for v, p, r in pairs])
    rng = np.random.default_rng(seed)

    def resampled():
        return [(rng.choice(v, len(v)).mean(), rng.choice(p, len(p)).mean(), r) for v, p, r in pairs]

    samples = np.array([improvements(resampled()) for _ in range(reps)])
    return point, np.percentile(samples, [2.5, 97.5], axis=0)


def summary_number_section(raw, randoms, tasks, ks, reps, seed):
    """The paper's summary number (mean relative improvement of VACO over PPO) beside ours."""
    tasks = [t for t in tasks if all(finals(raw, (a, k), t) for a in ("ppo", "vaco") for k in ks)]
    if not tasks:
        return []
    estimates = {k: relative_improvement(raw, randoms, tasks, k, reps, seed) for k in ks}
    lines = [f"VACO's improvement over PPO at the same K over {len(tasks)} task{'s' * (len(tasks) > 1)}, with 95% "
             "stratified-bootstrap "
             f"intervals ({reps} resamples of each task's seeds). *Relative to PPO's return*: (VACO − PPO) / |PPO| "
             "of the mean final returns, its mean over tasks (how the paper's summary reads; its exact definition "
             "is not given) and its median over tasks (of the same per-task numbers, each from the mean final "
             "returns), "
             "which a single task far ahead cannot carry. *Above random*: the mean "
             "over tasks of (VACO − PPO) / (PPO − random), which stays meaningful on tasks whose returns are "
             "negative or near 0.", "",
             "| definition | " + " | ".join(f"K = {k}" for k in ks) + " |", "|-|" + "-|" * len(ks)]
    for i, name in enumerate(("mean relative to PPO's return", "median relative to PPO's return",
                              "mean above random")):
        cells = [f"{100 * p[i]:+.1f} % [{100 * ci[0, i]:+.1f}, {100 * ci[1, i]:+.1f}]"
                 for p, ci in (estimates[k] for k in ks)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


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


def lag_recovered(raw, tasks, k, algorithms, reps, seed):
    """The share of PPO's lag loss that each algorithm wins back at K = k, (X_k - PPO_k) / (PPO_1 - PPO_k)
    of the mean final returns, per task and its mean over tasks, with 95% stratified-bootstrap intervals
    (the seeds of each algorithm and K resampled within each task). Returns {algorithm: (point, interval)}:
    point[i] is tasks[i]'s share, point[-2] the mean over tasks and point[-1] the median over tasks (of the
    per-task shares: a task whose small loss makes its share large cannot carry it); interval is shaped
    (2, len(tasks) + 2)."""
    def shares(means):
        per_task = [(x - ppo_k) / (ppo_1 - ppo_k) for x, ppo_k, ppo_1 in means]
        return np.array(per_task + [np.mean(per_task), np.median(per_task)])

    estimates = {}
    for algorithm in algorithms:
        rng = np.random.default_rng(seed)  # the same resamples of PPO's seeds for every algorithm, whichever ran
        groups = [[np.array(finals(raw, key, t)) for key in ((algorithm, k), ("ppo", k), ("ppo", 1))] for t in tasks]
        point = shares([[g.mean() for g in group] for group in groups])
        with np.errstate(divide="ignore", invalid="ignore"):  # a resample where PPO lost nothing to lag
            samples = [shares([[rng.choice(g, len(g)).mean() for g in group] for group in groups])
                       for _ in range(reps)]
        estimates[algorithm] = point, np.percentile(samples, [2.5, 97.5], axis=0)
    return estimates


def expected_seeds(raw):
    """How many seeds a finished block of the study has: the most that synchronous PPO has on a task."""
    return max((len(seeds) for seeds in raw.get(("ppo", 1), {}).values()), default=0)


def planned_runs(results_dir):
    """{(task, algorithm, k, seed)} that the study's presets writing into this folder plan (empty for a folder
    no preset writes: then a block counts as finished with synchronous PPO's number of seeds on every task)."""
    name = os.path.basename(os.path.abspath(results_dir))
    return {(r.task, r.algorithm, r.k, r.seed) for preset in PRESETS if FOLDERS.get(preset, preset) == name
            for r in grid(preset)}


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


def incomplete_line(partial, k):
    return [f"Incomplete at K = {k}, in no table here: " + ", ".join(
        f"{RECOVERERS.get(a, a)} ({runs} of {expected} runs)" for a, (runs, expected) in partial.items()) + ".", ""] \
        if partial else []


def lag_recovered_section(raw, normalised, randoms, tasks, k, reps, seed, out, planned=frozenset()):
    """The tasks where lag hurts PPO, and on each the share of PPO's loss that each method under lag (RECOVERERS)
    wins back at K = k; their mean over these tasks and P(X > PPO) at K = k, then a figure of it."""
    hurt = lag_hurt_tasks(raw, randoms, tasks, k)
    algorithms, partial = completeness(raw, RECOVERERS, k, tasks, planned)
    if not hurt or not algorithms:
        return []
    estimates = lag_recovered(raw, hurt, k, algorithms, reps, seed)
    pairs = {}
    for algorithm in algorithms:
        for name, among in (("these tasks", hurt), (f"all {len(tasks)} tasks", tasks)):
            x = score_matrix(normalised, (algorithm, k), among, "final")
            ppo = score_matrix(normalised, ("ppo", k), among, "final")
            if x is not None and ppo is not None:
                pairs[f"{algorithm},{name}"] = (x, ppo)
    improvement = probability_of_improvement(pairs, reps, seed) if pairs else ({}, {})
    names = [RECOVERERS[a] for a in algorithms]
    lines = [f"Where lag hurts PPO: the tasks where PPO's mean final return at K = {k} is below {LAG_HURTS} of its "
             f"mean at K = 1, both measured above the random policy: {', '.join(hurt)}. On each, the share of PPO's "
             f"loss that X wins back, (X at K = {k} − PPO at K = {k}) / (PPO at K = 1 − PPO at K = {k}) of the mean "
             "final returns: 1 = all of it, 0 = none, below 0 = X behind PPO under lag. 95% stratified-bootstrap "
             f"intervals ({reps} resamples of each task's seeds, per algorithm and K). P(X > PPO): the probability "
             f"that a run of X beats a run of PPO at K = {k} on a task drawn at random (normalised final scores).", "",
             f"| task | PPO K={k} / K=1, above random | " + " | ".join(names) + " |", "|-|-|" + "-|" * len(names)]
    for i, task in enumerate(hurt):
        lost = above_random_ratio(finals(raw, ("ppo", k), task), finals(raw, ("ppo", 1), task), randoms[task])
        lines.append(f"| {task} | {lost:.2f} | "
                     + " | ".join(fmt_interval(estimates[a][0][i], estimates[a][1][:, i]) for a in algorithms) + " |")
    for j, name in ((-2, "mean"), (-1, "median")):
        lines.append(f"| **{name} over these {len(hurt)} tasks** | | "
                     + " | ".join(f"**{fmt_interval(estimates[a][0][j], estimates[a][1][:, j])}**" for a in algorithms)
                     + " |")
    points, intervals = improvement
    for name in ("these tasks", f"all {len(tasks)} tasks"):
        cells = [fmt_interval(points[f"{a},{name}"], intervals[f"{a},{name}"].ravel()) if f"{a},{name}" in points
                 else "" for a in algorithms]
        lines.append(f"| P(X > PPO) at K={k}, {name} | | " + " | ".join(cells) + " |")
    lag_recovered_figure(hurt, algorithms, estimates, k, out.path("lag_recovered.png"))
    return lines + [""] + incomplete_line(partial, k)


def final_rate_factor(runs, key, task):
    """GePPO's learning-rate factor at the last of n updates, mean over seeds: the actor's rate over the annealed
    rate, which is the first update's times 1 - (n - 1) / n (the rule has not acted before the first update)."""
    factors = [float(rows[-1]["actor_learning_rate"]) * len(rows) / float(rows[0]["actor_learning_rate"])
               for meta, rows in runs if (meta["algorithm"], meta["k"]) == key and meta["task"] == task
               and rows and rows[-1].get("actor_learning_rate", "") != "" and float(rows[0]["actor_learning_rate"]) > 0]
    return float(np.mean(factors)) if factors else None


def trust_region_section(runs, raw, normalised, randoms, tasks, k, reps, seed, out, planned=frozenset()):
    """Which part of a method wins lag back, at K = k on `tasks`: every method under lag (RECOVERERS) beside PPO,
    made of which advantages and which trust region; their IQM, P(X > PPO), P(X > decoupled PPO), the share of
    PPO's lag loss won back and the seed pairs won, per method and per task; then one variable at a time (the
    advantages under one trust region, the trust region under V-trace), and the diagnostics where they disagree."""
    methods, partial = completeness(raw, RECOVERERS, k, tasks, planned)
    if len(methods) < 2 or not all(finals(raw, ("ppo", kk), t) for kk in (1, k) for t in tasks):
        return []  # nothing to set side by side
    names = {"ppo": "PPO", **RECOVERERS}
    matrices = {a: score_matrix(normalised, (a, k), tasks, "final") for a in ["ppo", *methods]}
    points, intervals = aggregates(matrices, reps, seed)
    pairs = {f"{a},{b}": (matrices[a], matrices[b]) for a in methods for b in ("ppo", "ppo-decoupled")
             if b in matrices and a != b}
    pairs.update({f"{to},{frm}": (matrices[to], matrices[frm]) for _, steps in ONE_VARIABLE for frm, to in steps
                  if frm in matrices and to in matrices})
    improvement, improvement_ci = probability_of_improvement(pairs, reps, seed)
    p = lambda a, b: fmt_interval(improvement[f"{a},{b}"], improvement_ci[f"{a},{b}"].ravel()) \
        if f"{a},{b}" in improvement else ""  # noqa: E731
    hurt = lag_hurt_tasks(raw, randoms, tasks, k)
    shares = lag_recovered(raw, hurt, k, methods, reps, seed) if hurt else {}
    won = {a: [(pairs_won(finals(raw, (a, k), t), finals(raw, ("ppo", k), t)),
                len(finals(raw, (a, k), t)) * len(finals(raw, ("ppo", k), t))) for t in tasks] for a in methods}
    behind = {a: [t for t, (w, n) in zip(tasks, won[a]) if w <= CLEARLY_BEHIND * n] for a in methods}
    lines = [f"At K = {k} on {len(tasks)} tasks ({', '.join(tasks)}), {expected_seeds(raw)} seeds per method. *IQM*: "
             "of the normalised final score (1 = PPO at K = 1). *P(X > Y)*: the probability that a run of X beats a "
             "run of Y on a task drawn at random. 95% stratified-bootstrap intervals "
             f"({reps} resamples).", "",
             f"| method | advantages | trust region | IQM at K={k} | P(X > PPO) | P(X > decoupled PPO) |",
             "|-|-|-|-|-|-|"]
    for a in ["ppo", *methods]:
        lines.append(f"| {names[a]} | {PARTS[a][0]} | {PARTS[a][1]} | "
                     f"{fmt_interval(points[a][1], intervals[a][:, 1])} | {p(a, 'ppo')} | {p(a, 'ppo-decoupled')} |")
    if hurt:
        lines += ["", f"*Lag won back*: the share of PPO's loss from K = 1 to K = {k} that X wins back, median over "
                  f"the {len(hurt)} tasks where lag hurts PPO ({', '.join(hurt)}), with its interval, and the range of "
                  "the per-task shares. *Pairs won*: of every pairing of a seed of X with a seed of PPO at "
                  f"K = {k}, on all {len(tasks)} tasks, those where X's final return is higher. *Clearly behind PPO*: "
                  f"the tasks where X wins at most {CLEARLY_BEHIND * 9:.0f} of 9 pairs.", "",
                  "| method | lag won back (median) | range over tasks | pairs won | clearly behind PPO on |",
                  "|-|-|-|-|-|"]
        for a in methods:
            point, interval = shares[a]
            lines.append(f"| {names[a]} | {fmt_interval(point[-1], interval[:, -1])} | "
                         f"{point[:len(hurt)].min():.2f} to {point[:len(hurt)].max():.2f} | "
                         f"{sum(w for w, _ in won[a])}/{sum(n for _, n in won[a])} | {', '.join(behind[a]) or 'none'} |")
    lines += ["", f"Per task: *X/PPO*, (X − random) / (PPO − random) of the mean final returns at K = {k}, and the seed "
              "pairs X wins against PPO; bold where X is clearly behind PPO.", "",
              "| task | " + " | ".join(names[a] for a in methods) + " |", "|-|" + "-|" * len(methods)]
    for i, task in enumerate(tasks):
        cells = []
        for a in methods:
            w, n = won[a][i]
            cell = f"{above_random_ratio(finals(raw, (a, k), task), finals(raw, ('ppo', k), task), randoms[task]):.2f} ({w}/{n})"
            cells.append(f"**{cell}**" if task in behind[a] else cell)
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    steps = [(what, frm, to) for what, pairs_of in ONE_VARIABLE for frm, to in pairs_of if frm in methods + ["ppo"]
             and to in methods]
    if steps:
        lines += ["", "One variable at a time: two methods that differ in one part only. *P(to > from)* on all "
                  f"{len(tasks)} tasks; *lag won back*: the medians above; *either side of PPO*: the tasks where one "
                  "of the two is ahead of PPO and the other behind (mean final returns).", "",
                  "| what changes | from | to | P(to > from) | lag won back, from → to | either side of PPO |",
                  "|-|-|-|-|-|-|"]
        for what, frm, to in steps:
            moved = f"{shares[frm][0][-1]:.2f} → {shares[to][0][-1]:.2f}" if frm in shares and to in shares else ""
            ppo = {t: np.mean(finals(raw, ("ppo", k), t)) for t in tasks}
            split = [t for t in tasks if (np.mean(finals(raw, (frm, k), t)) > ppo[t])
                     != (np.mean(finals(raw, (to, k), t)) > ppo[t])]
            lines.append(f"| {what} | {names[frm]} | {names[to]} | {p(to, frm)} | {moved} | {', '.join(split) or 'none'} |")
    lines += disputed_diagnostics(runs, raw, randoms, tasks, k, methods)
    trust_region_figure(points, intervals, ["ppo", *methods], names, k, len(tasks), out.path("trust_region.png"))
    return lines + [""] + incomplete_line(partial, k)


def disputed_diagnostics(runs, raw, randoms, tasks, k, methods):
    """On each task where one method is ahead of PPO at K = k and another behind (mean final returns), what
    each logged: backward TV, clip or filter fraction, the TV from π_T during the update, entropy, and GePPO's
    learning-rate factor at the end."""
    ppo = {t: np.mean(finals(raw, ("ppo", k), t)) for t in tasks}
    disputed = [t for t in tasks if len({np.mean(finals(raw, (a, k), t)) > ppo[t] for a in methods}) > 1]
    if not disputed:
        return []
    lines = ["", f"Where the methods disagree at K = {k} (one ahead of PPO, another behind), means over runs and "
             "updates. *Clip or filter*: the share of samples outside the clip range or band (PPO, decoupled, GePPO), "
             "or detached by the filter (VACO). *TV from π_T*: ½·mean|π_θ/β − π_T/β| per minibatch (GePPO's; for "
             "the others the TV from β, *tv_divergence*, is in the CSVs). *Rate factor*: GePPO's actor learning rate "
             "over the critic's at the last update.", "",
             "| task | method | X/PPO | backward TV | clip or filter | TV from π_T | entropy | rate factor |",
             "|-|-|-|-|-|-|-|-|"]
    for task in disputed:
        for a in ["ppo", *methods]:
            d = diagnostics(runs, (a, k), [task])
            fraction = d.get("filtered_fraction", d.get("clipfrac"))
            factor = final_rate_factor(runs, (a, k), task)
            cells = [f"{above_random_ratio(finals(raw, (a, k), task), finals(raw, ('ppo', k), task), randoms[task]):.2f}",
                     f"{d['backward_tv']:.3g}" if "backward_tv" in d else "", f"{fraction:.3g}" if fraction is not None
                     else "", f"{d['proximal_tv']:.3g}" if "proximal_tv" in d else "",
                     f"{d['entropy']:.3g}" if "entropy" in d else "", f"{factor:.2f}" if factor is not None else ""]
            lines.append(f"| {task} | {RECOVERERS.get(a, 'PPO')} | " + " | ".join(cells) + " |")
    return lines


def cap_share(runs, key, tasks, cap=100.0):
    """The share of updates, over the runs of `key` on `tasks`, whose largest pi_T/beta passed `cap`: where decoupled
    PPO's weight was capped (its cap is 100)."""
    maxima = [float(r["backward_ratio_max"]) for meta, rows in runs if (meta["algorithm"], meta["k"]) == key
              and meta["task"] in tasks for r in rows if r.get("backward_ratio_max", "") != ""]
    return float(np.mean(np.array(maxima) > cap)) if maxima else None


def lag_scan_section(runs, raw, normalised, randoms, k_main, k, reps, seed, out, planned=frozenset()):
    """A larger lag K = k on the tasks PPO ran at it, beside K = 1 and k_main: per task and method the normalised
    final score at each K; the IQM over those tasks at each K; the share of PPO's lag loss won back at K = k; and
    what each method logs at k_main and at k (backward TV, the weight pi_T/beta and how often decoupled PPO's cap
    binds, clip or filter fraction, entropy). Then a figure of the score against K."""
    tasks = sorted(raw.get(("ppo", k), {}))
    methods, partial = completeness(raw, RECOVERERS, k, tasks, planned)
    if not tasks or not all(finals(raw, ("ppo", kk), t) for kk in (1, k_main) for t in tasks):
        return incomplete_line(partial, k)
    names = {"ppo": "PPO", **RECOVERERS}
    scan_ks = [1, k_main, k]
    keys = [(a, kk) for a in ["ppo", *methods] for kk in scan_ks if all(finals(raw, (a, kk), t) for t in tasks)]
    lines = [f"Lag K = {k} (snapshots 0 to {k - 1} updates old, {(k - 1) / 2:g} on average once the buffer is full, after "
             f"{k - 1} updates) on {', '.join(tasks)}, beside K = 1 and {k_main}, every method at its K = {k_main} settings. "
             "Normalised final score, mean over seeds (1 = PPO at K = 1, 0 = random).", "",
             "| task | method | " + " | ".join(f"K = {kk}" for kk in scan_ks) + " |", "|-|-|" + "-|" * len(scan_ks)]
    for task in tasks:
        for a in ["ppo", *methods]:
            cells = [f"{np.mean([s['final'] for s in normalised[(a, kk)][task].values()]):.2f}"
                     if (a, kk) in keys else "" for kk in scan_ks]
            lines.append(f"| {task} | {names[a]} | " + " | ".join(cells) + " |")
    matrices = {f"{a} K={kk}": score_matrix(normalised, (a, kk), tasks, "final") for a, kk in keys}
    points, intervals = aggregates(matrices, reps, seed)
    lines += ["", f"IQM over these {len(tasks)} tasks × seeds, with 95% stratified-bootstrap intervals ({reps} "
              "resamples).", "", "| method | " + " | ".join(f"K = {kk}" for kk in scan_ks) + " |",
              "|-|" + "-|" * len(scan_ks)]
    for a in ["ppo", *methods]:
        cells = [fmt_interval(points[f"{a} K={kk}"][1], intervals[f"{a} K={kk}"][:, 1]) if (a, kk) in keys else ""
                 for kk in scan_ks]
        lines.append(f"| {names[a]} | " + " | ".join(cells) + " |")
    hurt = lag_hurt_tasks(raw, randoms, tasks, k)
    if hurt and methods:
        shares = lag_recovered(raw, hurt, k, methods, reps, seed)
        lines += ["", f"The share of PPO's loss from K = 1 to K = {k} that X wins back, (X − PPO) / (PPO at K = 1 − PPO) "
                  f"at K = {k} of the mean final returns, on the tasks where lag hurts PPO at K = {k} "
                  f"({', '.join(hurt)}), with 95% stratified-bootstrap intervals.", "",
                  "| task | " + " | ".join(names[a] for a in methods) + " |", "|-|" + "-|" * len(methods)]
        for i, task in enumerate(hurt):
            lines.append(f"| {task} | " + " | ".join(fmt_interval(shares[a][0][i], shares[a][1][:, i]) for a in methods)
                         + " |")
        for j, name in ((-2, "mean"), (-1, "median")):
            lines.append(f"| **{name}** | " + " | ".join(f"**{fmt_interval(shares[a][0][j], shares[a][1][:, j])}**"
                                                          for a in methods) + " |")
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
            d = diagnostics(runs, (a, kk), tasks)
            fraction = d.get("filtered_fraction", d.get("clipfrac"))
            get = lambda c: f"{d[c]:.3g}" if c in d else ""  # noqa: E731
            capped = cap_share(runs, (a, kk), tasks)
            lines.append(f"| {names[a]} | {kk} | {get('backward_tv')} | {get('backward_ratio_mean')} | "
                         f"{get('backward_ratio_max')} | {'' if capped is None else f'{capped:.2f}'} | "
                         f"{'' if fraction is None else f'{fraction:.3g}'} | {get('entropy')} |")
    lag_scan_figure(normalised, points, intervals, ["ppo", *methods], names, keys, scan_ks, tasks,
                    out.path(f"lag_scan_K{k}.png"))
    return lines + [""] + incomplete_line(partial, k)


def disagreement_section(runs, raw, randoms, tasks, k):
    """Decoupled PPO and VACO at K = k beside PPO: how each does and what each logs. Bold: the tasks where
    they disagree, one ahead of PPO and the other behind it (mean final returns)."""
    if not any(finals(raw, ("ppo-decoupled", k), t) for t in tasks):
        return []
    lines = [f"At K = {k}, means over runs and updates. *X/PPO*: (X − random) / (PPO − random) of the mean final "
             "returns. *Clip*: the share of samples outside PPO's clip range, which decoupled PPO measures on "
             "π_θ/π_T and PPO on π_θ/β. *w*: π_T/β at the update's start, decoupled PPO's weight: its mean, and "
             "the mean over updates of its largest value. *KL*: approx KL(β ‖ π) per update. Bold: one of VACO and "
             "decoupled PPO ahead of PPO and the other behind.", "",
             "| task | VACO/PPO | decoupled/PPO | clip PPO | clip decoupled | w mean | w max | KL PPO | KL VACO | "
             "KL decoupled | entropy PPO | entropy VACO | entropy decoupled |", "|-|" + "-|" * 12]
    for task in tasks:
        ppo, vaco, decoupled = (finals(raw, (a, k), task) for a in ("ppo", "vaco", "ppo-decoupled"))
        if not (ppo and vaco and decoupled):
            continue
        d = {a: diagnostics(runs, (a, k), [task]) for a in ("ppo", "vaco", "ppo-decoupled")}
        get = lambda a, c: f"{d[a][c]:.3g}" if c in d[a] else ""  # noqa: E731
        disagree = (np.mean(vaco) > np.mean(ppo)) != (np.mean(decoupled) > np.mean(ppo))
        cells = [f"{above_random_ratio(vaco, ppo, randoms[task]):.2f}",
                 f"{above_random_ratio(decoupled, ppo, randoms[task]):.2f}", get("ppo", "clipfrac"),
                 get("ppo-decoupled", "clipfrac"), get("ppo-decoupled", "backward_ratio_mean"),
                 get("ppo-decoupled", "backward_ratio_max"), get("ppo", "approx_kl"), get("vaco", "approx_kl"),
                 get("ppo-decoupled", "approx_kl"), get("ppo", "entropy"), get("vaco", "entropy"),
                 get("ppo-decoupled", "entropy")]
        lines.append(f"| {f'**{task}**' if disagree else task} | " + " | ".join(cells) + " |")
    return lines + [""]


def diagnostics_section(runs, raw, randoms, tasks, ks):
    """Per task and K, VACO's lag and filter diagnostics beside PPO's, the rows where VACO is behind
    PPO (its mean final return below PPO's) in bold, with the seed pairs VACO wins."""
    lines = ["Means over runs and updates. *Pairs won*: of every pairing of a VACO seed with a PPO seed, those "
             "where VACO's final return is higher. *Filter on*: the share of minibatches whose TV exceeded δ; "
             "*filtered*: the share of samples detached; *KL*: approx KL(β ‖ π) per update; *backward TV*: TV "
             "between the learner and the behaviour policies at the update's start. Bold: VACO behind PPO at "
             "that K, i.e. its mean final return below PPO's.", "",
             "| task | K | VACO/PPO | pairs won | filter on | filtered | KL VACO | KL PPO | entropy VACO | "
             "entropy PPO | backward TV |", "|-|-|-|-|-|-|-|-|-|-|-|"]
    for task in tasks:
        for k in ks:
            ppo, vaco = finals(raw, ("ppo", k), task), finals(raw, ("vaco", k), task)
            if not (ppo and vaco):
                continue
            d, dp = diagnostics(runs, ("vaco", k), [task]), diagnostics(runs, ("ppo", k), [task])
            get = lambda diag, c: f"{diag[c]:.3g}" if c in diag else ""  # noqa: E731
            behind = np.mean(vaco) < np.mean(ppo)
            name = f"**{task}**" if behind else task
            lines.append(f"| {name} | {k} | {above_random_ratio(vaco, ppo, randoms[task]):.2f} | "
                         f"{pairs_won(vaco, ppo)}/{len(vaco) * len(ppo)} | {get(d, 'filter_on_fraction')} | "
                         f"{get(d, 'filtered_fraction')} | {get(d, 'approx_kl')} | "
                         f"{get(dp, 'approx_kl')} | {get(d, 'entropy')} | {get(dp, 'entropy')} | "
                         f"{get(d, 'backward_tv')} |")
    return lines + [""]


def window_section(runs, end_step):
    """Per task, algorithm and K: the return of the episodes that ended between 0.9 and 1 x end_step
    steps, for runs longer than that (mean over seeds and 95% t-interval)."""
    scores = defaultdict(list)
    for meta, rows in runs:
        if meta["total_timesteps"] > end_step:
            scores[(meta["task"], meta["algorithm"], meta["k"])].append(window_score(rows, end_step))
    if not scores:
        return []
    keys = sorted({(a, k) for _, a, k in scores}, key=lambda key: (key[0] not in MAIN_ALGORITHMS, key))
    lines = [f"The return of the episodes that ended between {0.9 * end_step:,.0f} and {end_step:,.0f} env steps of "
             "these longer runs: mean over seeds and its 95% Student-t interval. The learning rate anneals to 0 "
             "over a run's length, so this is not what a run of that length reaches.", "",
             "| task | " + " | ".join(f"{a} K={k}" for a, k in keys) + " |", "|-|" + "-|" * len(keys)]
    for task in sorted({t for t, _, _ in scores}):
        lines.append(f"| {task} | " + " | ".join(interval_cell(scores.get((task, a, k), [])) for a, k in keys) + " |")
    return lines + [""]


@dataclass
class Args:
    results_dir: tyro.conf.Positional[str]
    """a folder of study results (CSV + JSON per run), e.g. benchmark/results/cpu"""
    figures_dir: Optional[str] = None
    """where the PNG figures go (default: the results folder)"""
    reps: int = 2000
    """bootstrap resamples"""
    seed: int = 0
    """seed of the bootstrap: same CSVs and seed, same intervals"""
    window: Optional[int] = None
    """also report, for runs longer than this many env steps, their return in the last 10% before it
    (e.g. 1000000: what 3M-step runs reach at 0.9M-1M steps)"""


def main(args: Args):
    if not os.path.isdir(args.results_dir):
        sys.exit(f"error: {args.results_dir} is not a folder")
    runs = load_runs(args.results_dir)
    if not runs:
        sys.exit(f"error: no finished runs (JSON + CSV) in {args.results_dir}")
    tasks_all = sorted({meta["task"] for meta, _ in runs})
    # measured once per task and stored beside the results (benchmark/study/random_scores.py sets the precision)
    stored = load_random_scores(args.results_dir)
    entries = update_random_scores(args.results_dir, [t for t in tasks_all if t not in stored], ppo_references(runs))
    randoms = {task: entry["mean"] for task, entry in entries.items()}
    raw, normalised = score_table(runs, randoms)
    figures_dir = args.figures_dir or args.results_dir
    os.makedirs(figures_dir, exist_ok=True)
    out = FigureFolder(figures_dir, args.results_dir)

    every_key = sorted(raw, key=lambda key: (key[0] not in MAIN_ALGORITHMS, key[0], key[1]))
    # the main grid: the Ks at which PPO ran on every task; a larger K run on fewer tasks (the lag scan) has a
    # section of its own
    all_ks = sorted({k for _, k in every_key})
    ks = [k for k in all_ks if all(t in raw.get(("ppo", k), {}) for t in tasks_all)] or all_ks
    keys = [key for key in every_key if key[1] in ks]
    scan_ks = [k for k in all_ks if k > max(ks) and ("ppo", k) in raw]
    # the main comparison: tasks on which both PPO and VACO ran at every K, in normalised scores, which
    # need synchronous PPO (K = 1) on the task; without it the report gives returns only
    main_tasks = [t for t in tasks_all if all(t in raw.get((a, k), {}) for a in ("ppo", "vaco") for k in {1, *ks})]
    sweep = sorted({a for a, _ in keys if a.startswith("vaco-behaviour-") or a.startswith("vaco-proximal-")})
    sweep = sweep if len(sweep) > 1 else []  # one variant is no sweep (the ten tasks' VACO against pi_T: a method)
    sweep_tasks = sorted({task for (a, _), tasks in raw.items() if a in sweep for task in tasks})

    report = [f"# Study results: {os.path.basename(os.path.abspath(args.results_dir))}", "",
              f"{len(runs)} finished runs. Random-policy returns: "
              + ", ".join(f"{t} {randoms[t]:.1f}" for t in tasks_all) + "."
              + ("" if ("ppo", 1) in raw else " No run of PPO at K = 1, so no normalised scores: returns only."), "",
              "## Final returns per task (mean ± sample std over seeds, number of seeds)", ""]
    report += marked("per_task", raw_section(raw, every_key, tasks_all))
    compared = [t for t in tasks_all if any(finals(raw, (a, k), t) for a in ("ppo", "vaco") for k in ks)]
    if any(a == "vaco" for a, _ in raw):
        head_ks = sorted({min(ks), max(ks)})
        planned = planned_runs(args.results_dir)
        report += titled("VACO against PPO per task", "vaco_vs_ppo",
                         comparison_section(raw, randoms, compared, head_ks, planned))
        recovered = lag_recovered_section(raw, normalised, randoms, compared, max(ks), args.reps, args.seed, out, planned)
        report += titled("Lag recovered", "lag_recovered", recovered)
        report += [f"![lag recovered]({out.link('lag_recovered.png')})", ""] if recovered else []
        report += titled("Decoupled PPO and VACO under lag", "decoupled_diagnostics",
                         disagreement_section(runs, raw, randoms, compared, max(ks)))
        trust_region = trust_region_section(runs, raw, normalised, randoms, compared, max(ks), args.reps, args.seed, out,
                                            planned)
        report += titled("Which part wins lag back: the advantages and the trust region", "trust_region", trust_region)
        report += [f"![trust region]({out.link('trust_region.png')})", ""] if trust_region else []
        for k in scan_ks:
            scan = lag_scan_section(runs, raw, normalised, randoms, max(ks), k, args.reps, args.seed, out, planned)
            report += titled(f"How much lag: K = 1, {max(ks)} and {k}", f"lag_scan_k{k}", scan)
            report += [f"![how much lag]({out.link(f'lag_scan_K{k}.png')})", ""] if scan else []
        report += titled("Relative improvement of VACO over PPO", "summary_number",
                         summary_number_section(raw, randoms, compared, head_ks, args.reps, args.seed))
        report += titled("Lag and filter diagnostics per task", "diagnostics",
                         diagnostics_section(runs, raw, randoms, compared, head_ks))
    if args.window:
        report += titled(f"Inside the runs, at {args.window:,} steps", "window", window_section(runs, args.window))
    estimates = {}
    for metric in ("final", "auc"):
        if main_tasks:
            section, points, intervals = aggregate_section(
                normalised, [k for k in keys if k[0] in MAIN_ALGORITHMS], main_tasks, metric, args.reps, args.seed)
            report += titled(f"Aggregates, {metric} score", f"aggregates_{metric}", section)
            estimates[metric] = (points, intervals)
    if main_tasks:
        report += titled("Probability of improvement of VACO (final score)", "improvement",
                         improvement_section(normalised, keys, main_tasks, ks, args.reps, args.seed))
    report += baselines_sections(raw, normalised, ks, args.reps, args.seed, main_tasks)
    if sweep_tasks:
        report += ["## TV threshold sweep", ""]
        report += marked("sweep", sweep_section(runs, normalised, sweep, sweep_tasks, args.reps, args.seed, out))
        report += [f"![delta sensitivity]({out.link('delta_sensitivity.png')})", ""]
    report += figures(raw, runs, keys, ks, main_tasks, estimates, out, sweep)
    path = os.path.join(args.results_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(report) + "\n")
    print("\n".join(report))
    print(f"\nreport: {path}; figures in {figures_dir}")


def baseline_tasks(raw, ks):
    """(algorithms, Ks, tasks) of the baselines comparison: every main algorithm that ran, at K = 1
    and the largest K, on the tasks where all of them ran (often fewer than PPO's and VACO's)."""
    base_ks = sorted({1, max(ks)})
    present = [a for a in MAIN_ALGORITHMS if all((a, k) in raw for k in base_ks)]
    tasks = sorted(set.intersection(*(set(raw[(a, k)]) for a in present for k in base_ks))) if present else []
    return present, base_ks, tasks


def baselines_sections(raw, normalised, ks, reps, seed, main_tasks=None):
    """Aggregates and P(VACO > X) of every algorithm on the tasks they all ran, when there are baselines
    that the main sections leave out (they ran on fewer tasks than PPO and VACO). Once they ran on
    every main task, the main sections hold them and this one would repeat them."""
    present, base_ks, tasks = baseline_tasks(raw, ks)
    repeated = main_tasks is not None and set(main_tasks) <= set(tasks)
    if len(present) <= 2 or "vaco" not in present or not tasks or repeated:
        return []
    keys = [(a, k) for k in base_ks for a in present]
    section, _, _ = aggregate_section(normalised, keys, tasks, "final", reps, seed)
    return (titled("Baselines and ablations, final score", "baselines", section)
            + titled("Probability of improvement of VACO over the baselines (final score)", "baselines_improvement",
                     improvement_section(normalised, keys, tasks, base_ks, reps, seed)))


def improvement_section(normalised, keys, tasks, ks, reps, seed):
    pairs = {}
    for k in ks:
        vaco = score_matrix(normalised, ("vaco", k), tasks, "final")
        for algorithm in MAIN_ALGORITHMS:
            other = score_matrix(normalised, (algorithm, k), tasks, "final")
            if algorithm != "vaco" and vaco is not None and other is not None:
                pairs[f"vaco,{algorithm} K={k}"] = (vaco, other)
    if not pairs:
        return []
    points, intervals = probability_of_improvement(pairs, reps, seed)
    lines = ["P(VACO > X): the probability that a run of VACO beats a run of X on a task drawn at random, "
             "with 95% stratified-bootstrap intervals. 0.5 = no difference.", "",
             "| X | K | P(VACO > X) |", "|-|-|-|"]
    for name in pairs:
        other, k = name.split(",", 1)[1].rsplit(" K=", 1)
        lines.append(f"| {other} | {k} | {fmt_interval(points[name], intervals[name].ravel())} |")
    return lines + [""]


def sweep_section(runs, normalised, sweep, tasks, reps, seed, out):
    """The delta x reference sweep: aggregates of final and AUC scores, and the filter's activity."""
    lines = [f"Tasks: {', '.join(tasks)}. IQM of normalised scores with 95% intervals; "
             "filter diagnostics are means over runs and updates: *filter on*, the share of minibatches "
             "whose TV exceeded delta; *filtered*, the share of samples detached; *TV*, the TV the filter "
             "compares with delta; *KL*, the approximate KL(beta || pi) per update. At K = 1 the proximal "
             "policy is the behaviour policy, so the proximal variants are run at K > 1 only.", "",
             "| variant | K | seeds | IQM final | IQM AUC | filter on | filtered | TV | backward TV | KL |",
             "|-|-|-|-|-|-|-|-|-|-|"]
    plot = defaultdict(dict)
    for k in (1, 8):
        for metric in ("final", "auc"):
            matrices = {a: m for a in ["ppo"] + sweep
                        if (m := score_matrix(normalised, (a, k), tasks, metric)) is not None}
            if matrices:
                points, intervals = aggregates(matrices, reps, seed)
                for a in matrices:
                    plot[(a, k)][metric] = (points[a], intervals[a], matrices[a].shape[0])
    for k in (1, 8):
        for a in ["ppo"] + sweep:
            if (a, k) not in plot or len(plot[(a, k)]) < 2:
                continue
            (pf, cf, n), (pa, ca, _) = plot[(a, k)]["final"], plot[(a, k)]["auc"]  # point, interval, seeds
            d = diagnostics(runs, (a, k), tasks)
            get = lambda c: f"{d[c]:.3f}" if c in d else ""  # noqa: E731
            lines.append(f"| {a} | {k} | {n} | {fmt_interval(pf[1], cf[:, 1])} | {fmt_interval(pa[1], ca[:, 1])} | "
                         f"{get('filter_on_fraction')} | {get('filtered_fraction')} | {get('filter_tv')} | "
                         f"{get('backward_tv')} | {get('approx_kl')} |")
    lines += ["", "Ranking: the mean over K of the IQM of the normalised final score (a proximal variant's "
              "K = 1 score is that of its behaviour twin, the same run).", "",
              "| variant | K = 1 | K = 8 | mean |", "|-|-|-|-|"]
    ranking = []
    for a in sweep:
        twin = a.replace("proximal", "behaviour")
        k1 = plot.get((a, 1), plot.get((twin, 1), {})).get("final")
        k8 = plot.get((a, 8), {}).get("final")
        if k1 and k8:
            ranking.append(((k1[0][1] + k8[0][1]) / 2, a, k1[0][1], k8[0][1]))
    for mean, a, k1, k8 in sorted(ranking, reverse=True):
        lines.append(f"| {a} | {k1:.2f} | {k8:.2f} | {mean:.2f} |")
    delta_figure(plot, sweep, out.path("delta_sensitivity.png"))
    return lines


# --- figures ------------------------------------------------------------------------------------
# Drawn for a docs column of 6.4 in (1280 px at FIGURE_DPI; the page shows it at its column's
# width): at most two panels a row, so that on a phone (about 400 px wide) a panel is still half
# the screen; every axis labelled, legends at FONT["legend.fontsize"] pt and outside the data.

FIGURE_DPI = 200
FIGURE_WIDTH = 6.4
FONT = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
        "ytick.labelsize": 11, "legend.fontsize": 11, "legend.title_fontsize": 11, "figure.titlesize": 12}
# one colour per algorithm in every figure (matplotlib's tab10); the sweep's variants take the rest
COLOURS = dict(zip(MAIN_ALGORITHMS, [f"C{i}" for i in range(len(MAIN_ALGORITHMS) - 1)] + ["teal"]))
COLOURS.update({"vaco-proximal-0.1": "C8", "vtrace-decoupled": "C9", "geppo": "olive", "geppo-gae": "darkkhaki"})
SWEEP_COLOURS = ["C8", "C9", "black", "C7", "gold", "navy"]


def colour(algorithm, sweep=()):
    """An algorithm's colour; a sweep's variants take the sweep's palette, in their order."""
    if algorithm in sweep:
        return SWEEP_COLOURS[sorted(sweep).index(algorithm) % len(SWEEP_COLOURS)]
    return COLOURS.get(algorithm, "black")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    fig.savefig(path, dpi=FIGURE_DPI)
    pyplot().close(fig)


def k_list(ks):
    """"K = 1 and 8", "K = 1, 2 and 8"."""
    ks = [str(k) for k in ks]
    return "K = " + (ks[0] if len(ks) == 1 else ", ".join(ks[:-1]) + " and " + ks[-1])


@dataclass
class FigureFolder:
    """Where figures are saved, and how the report (in another folder, maybe) links to them."""
    folder: str
    report_folder: str

    def path(self, name):
        return os.path.join(self.folder, name)

    def link(self, name):
        return os.path.relpath(self.path(name), self.report_folder)


def delta_figure(plot, sweep, path):
    """IQM against delta for each reference of the filter: rows final and AUC score, columns K = 1, 8."""
    plt = pyplot()
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(2, 2, figsize=(FIGURE_WIDTH, 6.4), layout="constrained", squeeze=False)
        handles = {}
        for row, metric in enumerate(("final", "auc")):
            for col, k in enumerate((1, 8)):
                ax = axes[row][col]
                for reference, marker, c in (("behaviour", "o", "C0"), ("proximal", "s", "C1")):
                    pts = sorted((float(a.rsplit("-", 1)[1]), plot[(a, k)][metric]) for a in sweep
                                 if a.startswith(f"vaco-{reference}-") and metric in plot.get((a, k), {}))
                    if pts:
                        deltas = [d for d, _ in pts]
                        iqm = np.array([p[0][1] for _, p in pts])
                        lo, hi = np.array([p[1][0, 1] for _, p in pts]), np.array([p[1][1, 1] for _, p in pts])
                        handles[reference] = ax.errorbar(deltas, iqm, yerr=[iqm - lo, hi - iqm], marker=marker,
                                                         color=c, capsize=3, lw=1.8)
                if metric in plot.get(("ppo", k), {}):
                    handles["ppo"] = ax.axhline(plot[("ppo", k)][metric][0][1], color="grey", lw=1.2, ls="--")
                ax.set_xscale("log")
                ax.set_xticks(DELTAS, [str(d) for d in DELTAS])
                ax.minorticks_off()
                ax.set_xlabel("TV threshold δ")
                ax.set_ylabel("IQM (1 = PPO at K = 1)")
                ax.set_title(f"K = {k}, {'AUC' if metric == 'auc' else metric} score"
                             + (" (proximal = behaviour)" if k == 1 else ""))
                ax.grid(True, alpha=0.25)
        labels = {"behaviour": r"TV against the behaviour policy $\beta$",
                  "proximal": r"TV against the proximal policy $\pi_T$", "ppo": "PPO at the same K"}
        order = [name for name in labels if name in handles]
        fig.legend([handles[n] for n in order], [labels[n] for n in order], loc="outside upper center", ncol=2,
                   title="normalised IQM with 95 % interval")
    save(fig, path)


def lag_recovered_figure(tasks, algorithms, estimates, k, path):
    """Per task where lag hurts PPO, and their mean: the share of PPO's lag loss each algorithm wins back."""
    plt = pyplot()
    rows = tasks + [f"mean over {len(tasks)} tasks", f"median over {len(tasks)} tasks"]
    height = 0.8 / len(algorithms)
    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 1.6 + 0.55 * len(rows)), layout="constrained")
        for j, algorithm in enumerate(algorithms):
            point, interval = estimates[algorithm]
            y = np.arange(len(rows)) + (j - (len(algorithms) - 1) / 2) * height
            ax.barh(y, point, height=height * 0.9, color=colour(algorithm), alpha=0.8, label=RECOVERERS[algorithm])
            ax.errorbar(point, y, xerr=[point - interval[0], interval[1] - point], fmt="none", ecolor="black",
                        capsize=2, lw=1)
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(1, color="grey", lw=0.8, ls="--")
        ax.axvline(0.5, color="grey", lw=0.8, ls=":")
        # a task where PPO loses little has a share with a huge interval: the axis stops at -1.5 and 3
        ends = np.concatenate([estimates[a][1].ravel() for a in algorithms])
        ax.set_xlim(max(-1.5, ends.min() - 0.1), min(3.0, ends.max() + 0.1))
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylabel("task where lag hurts PPO")
        ax.invert_yaxis()  # the first task on top, the mean last
        ax.set_xlabel(f"share of PPO's loss from K = 1 to K = {k} won back\n"
                      "(0: PPO under lag, 1: without lag; axis cut at -1.5, 3)")
        ax.grid(True, axis="x", alpha=0.25)
        fig.legend(loc="outside upper center", ncol=min(3, len(algorithms)), title="estimate with 95 % interval")
    save(fig, path)


def trust_region_figure(points, intervals, methods, names, k, n_tasks, path):
    """The IQM of the normalised final score at K = k of every method under lag, with its interval, beside PPO."""
    plt = pyplot()
    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 1.4 + 0.5 * len(methods)), layout="constrained")
        for i, a in enumerate(methods):
            iqm, (lo, hi) = points[a][1], intervals[a][:, 1]
            ax.barh(i, iqm, color=colour(a), alpha=0.8)
            ax.errorbar(iqm, i, xerr=[[iqm - lo], [hi - iqm]], fmt="none", ecolor="black", capsize=3, lw=1)
        ax.axvline(1, color="grey", lw=0.8, ls="--")
        ax.set_yticks(range(len(methods)), [names[a] for a in methods])
        ax.set_ylabel("method")
        ax.invert_yaxis()
        ax.set_xlabel(f"IQM of the normalised final score at K = {k}\n({n_tasks} tasks; 1 = PPO at K = 1, dashed)")
        ax.set_title("IQM with its 95 % interval")
        ax.grid(True, axis="x", alpha=0.25)
    save(fig, path)


def lag_scan_figure(normalised, points, intervals, methods, names, keys, ks, tasks, path):
    """The normalised final score against K: the IQM over the tasks with its interval, then each task's mean over
    seeds (two panels a row), every method a colour."""
    plt = pyplot()
    rows = (len(tasks) + 2) // 2
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(rows, 2, figsize=(FIGURE_WIDTH, 1.6 + 2.6 * rows), layout="constrained",
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
                    ax.errorbar(run_ks, y, yerr=[y - lo, hi - y], marker="o", capsize=3, color=colour(a),
                                label=names[a], lw=1.6)
                else:
                    y = [np.mean([s["final"] for s in normalised[(a, kk)][tasks[panel - 1]].values()]) for kk in run_ks]
                    ax.plot(run_ks, y, marker="o", color=colour(a), lw=1.6)
            ax.axhline(1, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(kk) for kk in ks])
            ax.minorticks_off()
            ax.set_xlabel("policy lag K")
            ax.set_ylabel("normalised final score")
            ax.set_title(f"IQM over {len(tasks)} tasks" if panel == 0 else tasks[panel - 1])
            ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=min(3, len(methods)),
                   title="IQM with 95 % interval (first panel), mean over seeds (task panels)")
    save(fig, path)


def lag_figure(points, intervals, ks, main_tasks, path):
    """Normalised IQM of the final score against K, every main algorithm, with 95% intervals."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 5.4), layout="constrained")
        partial = {}  # algorithm: the Ks it ran at, when fewer than all
        for algorithm in MAIN_ALGORITHMS:
            pts = [(k, points[f"{algorithm} K={k}"][1], intervals[f"{algorithm} K={k}"][:, 1]) for k in ks
                   if f"{algorithm} K={k}" in points]
            if pts:
                x = [p[0] for p in pts]
                y = np.array([p[1] for p in pts])
                lo, hi = np.array([p[2][0] for p in pts]), np.array([p[2][1] for p in pts])
                complete = len(x) == len(ks)
                c = colour(algorithm)
                ax.plot(x, y, marker="o", label=algorithm, color=c, lw=2.4 if algorithm in ("ppo", "vaco") else 1.4,
                        ls="-" if complete else "--")
                if complete:
                    ax.fill_between(x, lo, hi, alpha=0.15, color=c)
                else:  # run at fewer K: dashed line, intervals only where measured
                    partial[algorithm] = x
                    ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="none", ecolor=c, capsize=3, lw=1)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("policy lag K (actors act with one of the last K policies)")
        ax.set_ylabel("IQM of normalised final score\n(1 = PPO at K = 1)")
        names = ", ".join(t.split("-")[0] for t in main_tasks)
        ax.set_title(f"Lag robustness ({names})" if len(main_tasks) <= 4 else f"Lag robustness, {len(main_tasks)} tasks")
        ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=4)
        style = [((Line2D([], [], color="grey", lw=2), Patch(color="grey", alpha=0.15)),
                  "run at every K: solid line, band = 95 % interval")]
        if partial:
            measured = sorted({tuple(x) for x in partial.values()})
            where = k_list(measured[0]) + " only" if len(measured) == 1 else "fewer K"
            style.append((Line2D([], [], color="grey", lw=1.4, ls="--", marker="o"),
                          f"run at {where}: the dashed line only joins the measured\n"
                          "points, bars = 95 % interval"))
        fig.legend(*zip(*style), loc="outside lower center", handlelength=2.5)
    save(fig, path)


def interval_figure(points, intervals, algorithms, k, tasks, path):
    """rliable's aggregate intervals of METRICS at one K, a 2 x 2 grid (one metric a panel)."""
    plt = pyplot()
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(2, 2, figsize=(FIGURE_WIDTH, 1.7 + 0.56 * len(algorithms)), sharey=True,
                                 layout="constrained")
        for i, (ax, metric) in enumerate(zip(axes.flat, METRICS)):
            for row, algorithm in enumerate(algorithms):
                name = f"{algorithm} K={k}"
                lo, hi = intervals[name][:, i]
                ax.barh(row, hi - lo, left=lo, height=0.6, color=colour(algorithm), alpha=0.75)
                ax.vlines(points[name][i], row - 0.3, row + 0.3, color="black", lw=1.5)
            ax.set_title(metric + ("\n(lower is better)" if metric == "Optimality Gap" else ""))
            ax.margins(x=0.08)
            ax.set_xlabel("normalised final score")
            ax.xaxis.set_major_locator(plt.MaxNLocator(4))
            ax.grid(True, axis="x", alpha=0.25)
            for side in ("top", "right", "left"):
                ax.spines[side].set_visible(False)
        axes[0][0].set_yticks(range(len(algorithms)), algorithms)
        axes[0][0].invert_yaxis()  # the first algorithm on top
        for row in axes:
            row[0].set_ylabel("algorithm")
        fig.suptitle(f"K = {k}, {', '.join(t.split('-')[0] for t in tasks)}:\npoint estimate (black) and 95 % interval")
    save(fig, path)


def compact_thousands(value, _position=None):
    """A tick label: 150000 -> "150k" (returns of 10^5 would widen the axis labels past the panel)."""
    return f"{value / 1000:g}k" if abs(value) >= 10_000 else f"{value:g}"


def curves_figure(runs, keys, ks, sweep, path, shown=None):
    """Learning curves (PPO, VACO, SPO, decoupled PPO and the sweep's variants when there are few of them,
    e.g. the finalists; or the algorithms in `shown`): one block per task, titled with its name, of one
    panel per K, two panels a row."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    tasks = sorted({t for key in keys for t in keys[key]})
    cols = 2 if len(ks) > 1 else 1
    rows = -(-len(ks) // cols)  # per task
    curves, steps = defaultdict(list), {}
    if shown is None:
        shown = {"ppo", "vaco", "spo", "ppo-decoupled"} | (set(sweep) if len(sweep) <= 3 else set())
    for meta, rows_ in runs:
        if meta["algorithm"] in shown:
            key = (meta["task"], meta["k"], meta["algorithm"])
            curves[key].append(slice_scores(rows_, meta["total_timesteps"], slices=50))
            steps[key] = max(steps.get(key, 0), meta["total_timesteps"])
    order = [a for a in MAIN_ALGORITHMS if a in shown] + sorted(shown - set(MAIN_ALGORITHMS))
    seeds, handles = defaultdict(set), {}
    with plt.rc_context(FONT):
        fig = plt.figure(figsize=(FIGURE_WIDTH, len(tasks) * (2.15 * rows + 0.4) + 1.1), layout="constrained")
        for task, block in zip(tasks, np.atleast_1d(fig.subfigures(len(tasks), 1))):
            block.suptitle(task, fontweight="bold")
            axes = block.subplots(rows, cols, squeeze=False)
            for ax in axes.flat[len(ks):]:
                ax.set_visible(False)
            for k, ax in zip(ks, axes.flat):
                for algorithm in order:
                    cs = curves.get((task, k, algorithm))
                    if not cs:
                        continue
                    c = np.array(cs)
                    x = np.linspace(0, steps[(task, k, algorithm)], c.shape[1] + 1)[1:] / 1e6
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        mean, std = np.nanmean(c, 0), np.nanstd(c, 0)
                    ended = ~np.isnan(mean)  # slices where no episode ended (long episodes, short runs) are bridged
                    x, mean, std = x[ended], mean[ended], std[ended]
                    handles[algorithm], = ax.plot(x, mean, color=colour(algorithm, sweep), lw=1.6)
                    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=colour(algorithm, sweep), lw=0)
                    seeds[algorithm].add(len(cs))
                ax.set_title(f"K = {k}")
                ax.set_xlabel("env steps (millions)")
                ax.set_ylabel("episode return")
                ax.yaxis.set_major_formatter(FuncFormatter(compact_thousands))
                ax.grid(True, alpha=0.25)
        legend = [a for a in order if a in handles]
        n = {a: (f"{min(seeds[a])}" if len(seeds[a]) == 1 else f"{min(seeds[a])}–{max(seeds[a])}") for a in legend}
        labels = [f"{a} ({n[a]} seed{'' if n[a] == '1' else 's'})" for a in legend]
        fig.legend([handles[a] for a in legend], labels, loc="outside upper center",
                   ncol=2, title="mean over seeds (line) ± one std (band)")
    save(fig, path)


def figures(raw, runs, keys, ks, main_tasks, estimates, out, sweep=()):
    """Lag robustness (IQM against K), aggregate intervals, learning curves; returns Markdown lines."""
    lines = ["## Figures", ""]
    if "final" in estimates:
        points, intervals = estimates["final"]
        lag_figure(points, intervals, ks, main_tasks, out.path("lag_robustness.png"))
        lines += [f"![lag robustness]({out.link('lag_robustness.png')})", ""]
        for k in (1, max(ks)):
            algorithms = [a for a in MAIN_ALGORITHMS if f"{a} K={k}" in points]
            if algorithms:
                interval_figure(points, intervals, algorithms, k, main_tasks, out.path(f"aggregates_K{k}.png"))
                lines += [f"![aggregates K={k}]({out.link(f'aggregates_K{k}.png')})", ""]
    curves_figure(runs, {key: raw[key] for key in keys}, ks, sweep, out.path("learning_curves.png"))
    return lines + [f"![learning curves]({out.link('learning_curves.png')})", "",
                    "Learning curves: mean ± std over seeds (their number in brackets) of the return "
                    "of episodes ending in each 2% of training.", ""]


if __name__ == "__main__":
    main(tyro.cli(Args))
