"""What moved with more seeds: the report's answers on every seed it has, beside the same answers on the seeds every
method first ran (before a preset of MORE_SEEDS added seeds to some of its blocks): each method's IQM at the grid's
largest K with its interval's width, the median share of the lag it wins back, the tasks where it is clearly behind
PPO, and whether VACO works (its median improvement over PPO's return, and the mean, the paper's summary number). A
method that kept its first seeds moves too, through synchronous PPO's mean (every score's 1) and PPO's seeds."""

from benchmark.study.presets import method
from benchmark.study.report import titled
from benchmark.study.scores import common_seeds, finals
from benchmark.study.sections import summary_number, which_script


def seeds(study, algorithm, k):
    """How many seeds `algorithm` has at K = k on every task it is compared on."""
    return len(common_seeds(study.raw, (algorithm, k), study.compared))


def width(entry):
    """The width of an IQM's interval (aggregates' entry), or "" for none."""
    return f"{entry[1]['x'][1, 1] - entry[1]['x'][0, 1]:.2f}" if entry else ""


def section(study):
    if not study.added:
        return "no added seed is in for every method on every task yet"
    before = study.first_seeds()
    now, then = which_script.answers(study), which_script.answers(before)
    if isinstance(now, str) or isinstance(then, str):
        return now if isinstance(now, str) else then
    k, tasks = now["k"], now["tasks"]
    counts = {a: (seeds(before, a, k), seeds(study, a, k)) for a in now["order"]}
    few, many = counts["ppo"]
    lines = [f"The answers above on all {many} seeds of PPO at K = {k} (and of the methods the added seeds were run "
             f"for), beside the same answers on their first {few}: the IQM at K = {k} with its 95% interval and the "
             f"interval's width, the median lag won back, and the tasks of {len(tasks)} where PPO at K = {k} wins at "
             f"least {1 - which_script.CLEARLY_BEHIND:.0%} of the pairings of seeds. A method's seeds in brackets "
             "where it kept its first ones.", "",
             f"| method | IQM, {few} seeds | width | IQM, {many} seeds | width | lag won back, {few} | {many} | "
             f"clearly behind, {few} | {many} |", "|-|-|-|-|-|-|-|-|-|"]
    for a in now["order"]:
        was, is_ = then["cells"].get(a, {}), now["cells"][a]
        name = method(a).name + (f" ({counts[a][1]} seeds)" if counts[a][0] == counts[a][1] and a != "ppo" else "")
        behind = [f"{c['behind']}" if "behind" in c else "" for c in (was, is_)]
        lines.append(f"| {name} | {which_script.iqm_cell(was.get('iqm'))} | {width(was.get('iqm'))} | "
                     f"{which_script.iqm_cell(is_['iqm'])} | {width(is_['iqm'])} | "
                     f"{which_script.share_cell(was.get('share'))} | {which_script.share_cell(is_['share'])} | "
                     f"{behind[0]} | {behind[1]} |")
    both = [t for t in tasks if all(finals(s.raw, (a, k), t) for s in (before, study) for a in ("ppo", "vaco"))]
    if both:
        estimates = [summary_number.relative_improvement(s.raw, s.randoms, both, k, s.reps, s.seed)
                     for s in (before, study)]
        cell = lambda estimate, i: f"{100 * estimate[0][i]:+.1f} % [{100 * estimate[1][0, i]:+.1f}, " \
                                   f"{100 * estimate[1][1, i]:+.1f}]"  # noqa: E731
        lines += ["", f"Does VACO work? Its improvement over PPO at K = {k}, (VACO − PPO) / |PPO| of the mean final "
                  f"returns over {len(both)} tasks:", "",
                  f"| | {few} seeds | {many} seeds |", "|-|-|-|",
                  f"| median over tasks | {cell(estimates[0], 1)} | {cell(estimates[1], 1)} |",
                  f"| mean over tasks (the paper's summary number) | {cell(estimates[0], 0)} | {cell(estimates[1], 0)} |"]
    return titled("What moved with more seeds", "what_moved", lines + [""])
