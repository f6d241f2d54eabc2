"""Aggregates of the normalised final and AUC scores: median, IQM, mean and optimality gap of every main algorithm
at every K of the grid, over the tasks where PPO and VACO ran at all of them, with 95% stratified-bootstrap
intervals. (Their figures, with the learning curves, are the report's last section: sections/figures.py.)"""

from benchmark.study.estimates import METRICS, aggregates
from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.report import fmt_interval, titled
from benchmark.study.scores import score_matrix

NO_NORMALISED_SCORES = "no task where PPO and VACO ran at K = 1 and at every K of the grid: no normalised scores"


def section(study):
    if not study.main_tasks:
        return NO_NORMALISED_SCORES
    lines = []
    for metric in ("final", "auc"):
        lines += titled(f"Aggregates, {metric} score", f"aggregates_{metric}",
                        table(study, main_keys(study), study.main_tasks, metric))
    return lines


def main_keys(study):
    """The main algorithms at every K of the grid."""
    return [key for key in study.grid_keys if key[0] in MAIN_ALGORITHMS]


def aggregate_estimates(study, keys, tasks, metric):
    """({"algorithm K=k": its (seeds x tasks) matrix}, points, intervals) of the aggregates of `keys` on `tasks`
    (empty where no key ran on every task)."""
    matrices = {f"{a} K={k}": m for a, k in keys
                if (m := score_matrix(study.normalised, (a, k), tasks, metric)) is not None}
    if not matrices:
        return {}, {}, {}
    return matrices, *aggregates(matrices, study.reps, study.seed)


def table(study, keys, tasks, metric):
    """A Markdown table of the aggregates of `keys` on `tasks` ([] if no key ran on every task)."""
    matrices, points, intervals = aggregate_estimates(study, keys, tasks, metric)
    if not matrices:
        return []
    lines = [f"Tasks: {', '.join(tasks)}. Normalised {metric} score; 95% stratified-bootstrap "
             f"intervals ({study.reps} resamples).", "",
             "| algorithm | K | seeds | " + " | ".join(METRICS) + " |", "|-|-|-|" + "-|" * len(METRICS)]
    for name, m in matrices.items():
        algorithm, k = name.rsplit(" K=", 1)
        cells = [fmt_interval(points[name][i], intervals[name][:, i]) for i in range(len(METRICS))]
        lines.append(f"| {algorithm} | {k} | {m.shape[0]} | " + " | ".join(cells) + " |")
    return lines + [""]
