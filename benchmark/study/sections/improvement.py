"""The probability of improvement of VACO over every other main algorithm at each K of the grid (normalised final
scores, the tasks where PPO and VACO ran at all of them), with 95% stratified-bootstrap intervals."""

from benchmark.study.estimates import probability_of_improvement
from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.report import fmt_interval, titled
from benchmark.study.scores import score_matrix
from benchmark.study.sections.aggregates import NO_NORMALISED_SCORES


def section(study):
    if not study.main_tasks:
        return NO_NORMALISED_SCORES
    return titled("Probability of improvement of VACO (final score)", "improvement",
                  table(study, study.main_tasks, study.ks))


def table(study, tasks, ks):
    """P(VACO > X) of every main algorithm X at each of `ks` on `tasks` ([] if VACO has no other to beat)."""
    pairs = {}
    for k in ks:
        vaco = score_matrix(study.normalised, ("vaco", k), tasks, "final")
        for algorithm in MAIN_ALGORITHMS:
            other = score_matrix(study.normalised, (algorithm, k), tasks, "final")
            if algorithm != "vaco" and vaco is not None and other is not None:
                pairs[f"vaco,{algorithm} K={k}"] = (vaco, other)
    if not pairs:
        return []
    points, intervals = probability_of_improvement(pairs, study.reps, study.seed)
    lines = ["P(VACO > X): the probability that a run of VACO beats a run of X on a task drawn at random, "
             "with 95% stratified-bootstrap intervals. 0.5 = no difference.", "",
             "| X | K | P(VACO > X) |", "|-|-|-|"]
    for name in pairs:
        other, k = name.split(",", 1)[1].rsplit(" K=", 1)
        lines.append(f"| {other} | {k} | {fmt_interval(points[name], intervals[name].ravel())} |")
    return lines + [""]
