"""The study's estimates with their intervals. Aggregates (rliable): median, IQM, mean and optimality gap over all
runs x tasks, with 95% stratified-bootstrap percentile intervals (resampling seeds within each task), and the
probability of improvement (rliable's number, counted here in numpy: the same floats, hundreds of times faster).
The bootstrap is seeded, so the same CSVs always give the same intervals. Then the share of PPO's lag loss a method
wins back, bootstrapped the same way. (The Student-t interval of a mean over seeds is benchmark/common.py's t_interval.)
"""

import numpy as np

from benchmark.study.scores import finals

METRICS = ["Median", "IQM", "Mean", "Optimality Gap"]


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


def improvement(scores_x, scores_y):
    """P(X > Y) + P(X = Y) / 2 on each task (columns; rows are runs), averaged over tasks: rliable's
    probability of improvement, whose Mann-Whitney U per task is this count of the pairs of runs (it is
    the same float, as both are exact halves divided by the number of pairs), without a scipy call per
    task and bootstrap sample."""
    x, y = scores_x[:, None, :], scores_y[None, :, :]
    pairs = scores_x.shape[0] * scores_y.shape[0]
    per_task = ((x > y).sum(axis=(0, 1)) + 0.5 * (x == y).sum(axis=(0, 1))) / pairs
    return np.mean(per_task)


def probability_of_improvement(pairs, reps, seed):
    """P(X > Y) with 95% intervals for each {"X,Y": (scores_x, scores_y)}."""
    return each_seeded(improvement, pairs, reps, seed)


def lag_won_back(raw, tasks, k, algorithms, reps, seed, against_itself=False):
    """The share of PPO's lag loss that each algorithm wins back at K = k, (X_k - PPO_k) / (PPO_1 - PPO_k)
    of the mean final returns, per task and its mean over tasks, with 95% stratified-bootstrap intervals
    (the seeds of each algorithm and K resampled within each task). With `against_itself`, the loss runs
    from PPO at K = k to the algorithm's own mean at K = 1, (X_k - PPO_k) / (X_1 - PPO_k): 1 when lag costs it
    nothing, whichever way it changes synchronous training. Returns {algorithm: (point, interval)}:
    point[i] is tasks[i]'s share, point[-2] the mean over tasks and point[-1] the median over tasks (of the
    per-task shares: a task whose small loss makes its share large cannot carry it); interval is shaped
    (2, len(tasks) + 2)."""
    def shares(means):
        per_task = [(x - ppo_k) / (ppo_1 - ppo_k) for x, ppo_k, ppo_1 in means]
        return np.array(per_task + [np.mean(per_task), np.median(per_task)])

    estimates = {}
    for algorithm in algorithms:
        rng = np.random.default_rng(seed)  # for every algorithm with as many seeds, the same resamples of PPO's
        reference = (algorithm if against_itself else "ppo", 1)
        groups = [[np.array(finals(raw, key, t)) for key in ((algorithm, k), ("ppo", k), reference)] for t in tasks]
        point = shares([[g.mean() for g in group] for group in groups])
        with np.errstate(divide="ignore", invalid="ignore"):  # a resample where PPO lost nothing to lag
            samples = [shares([[rng.choice(g, len(g)).mean() for g in group] for group in groups])
                       for _ in range(reps)]
        estimates[algorithm] = point, np.percentile(samples, [2.5, 97.5], axis=0)
    return estimates

