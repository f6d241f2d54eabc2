"""Baselines and ablations: aggregates and P(VACO > X) of every main algorithm that ran without lag and at the grid's
largest K, on the tasks where all of them ran, when the main sections leave some out (they ran on fewer tasks than
PPO and VACO). Once they ran on every main task, the main sections hold them and this one would repeat them."""

from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.report import titled
from benchmark.study.sections import aggregates, improvement


def section(study):
    present, base_ks, tasks = baseline_tasks(study.raw, study.ks)
    if len(present) <= 2 or "vaco" not in present or not tasks:
        return "no baseline beside PPO and VACO that ran without lag and at the grid's largest K"
    if set(study.main_tasks) <= set(tasks):
        return "the baselines ran on every main task: the aggregates above hold them"
    keys = [(a, k) for k in base_ks for a in present]
    return (titled("Baselines and ablations, final score", "baselines", aggregates.table(study, keys, tasks, "final"))
            + titled("Probability of improvement of VACO over the baselines (final score)", "baselines_improvement",
                     improvement.table(study, tasks, base_ks)))


def baseline_tasks(raw, ks):
    """(algorithms, Ks, tasks) of the baselines comparison: every main algorithm that ran, at K = 1
    and the largest K, on the tasks where all of them ran (often fewer than PPO's and VACO's)."""
    base_ks = sorted({1, max(ks)})
    present = [a for a in MAIN_ALGORITHMS if all((a, k) in raw for k in base_ks)]
    tasks = sorted(set.intersection(*(set(raw[(a, k)]) for a in present for k in base_ks))) if present else []
    return present, base_ks, tasks
