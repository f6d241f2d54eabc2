"""The relative improvement of VACO over PPO, without lag and at the grid's largest K: the paper's summary number
(the mean over tasks of (VACO - PPO) / |PPO|) beside its median over tasks and the mean above random, with 95%
stratified-bootstrap intervals."""

import numpy as np

from benchmark.study.report import titled
from benchmark.study.scores import finals


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    raw, randoms, ks, reps, seed = study.raw, study.randoms, study.head_ks, study.reps, study.seed
    tasks = [t for t in study.compared if all(finals(raw, (a, k), t) for a in ("ppo", "vaco") for k in ks)]
    if not tasks:
        return f"no task where PPO and VACO both ran at K = {' and '.join(map(str, ks))}"
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
    return titled("Relative improvement of VACO over PPO", "summary_number", lines + [""])


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
