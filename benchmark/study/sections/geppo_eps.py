"""GePPO's ε: how much the half-width of its band moves its result. ε = 0.1, what its authors' reuse of earlier
batches makes of their ε = 0.2, beside the study's ε = 0.2 (no reuse), at the grid's largest K, on the seeds that
ε = 0.1 ran: per task the final return of each on those seeds, and where ε = 0.1 ends against the range of ε = 0.2's
seeds; then the mean over tasks of the normalised scores."""

import numpy as np

from benchmark.study.report import titled
from benchmark.study.scores import completeness

VARIANT, BASE = "geppo-clip-0.1", "geppo"  # presets.ALGORITHMS: ε = 0.1 and the study's ε = 0.2


def section(study):
    k = max(study.ks)
    if (VARIANT, k) not in study.raw:
        return f"no run of GePPO with ε = 0.1 at K = {k}"
    raw, normalised = study.raw, study.normalised
    tasks = sorted(raw[(VARIANT, k)])
    done, partial = completeness(raw, [VARIANT], k, tasks, study.planned)
    if not done or not all(raw.get((BASE, k), {}).get(t) for t in tasks):
        runs, planned = partial.get(VARIANT, (sum(map(len, raw[(VARIANT, k)].values())), "?"))
        return titled(f"GePPO's ε at K = {k}", "geppo_eps", [
            f"Incomplete at K = {k}, in no table here: GePPO with ε = 0.1 ({runs} of {planned} runs).", ""])
    seeds = sorted({s for t in tasks for s in raw[(VARIANT, k)][t]})
    on = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))} (their mean)"
    lines = [f"GePPO at K = {k} with ε = 0.1 (`--clip-coef 0.1`) beside the study's ε = 0.2, final return on {on}, "
             "and the range of ε = 0.2's seeds; *outside* when ε = 0.1's return lies outside that range.", "",
             "| task | ε = 0.2 | ε = 0.1 | ε = 0.2, its seeds' range | ε = 0.1 |", "|-|-|-|-|-|"]
    shift = []
    for task in tasks:
        base = raw[(BASE, k)][task]
        same = [base[s]["final"] for s in seeds if s in base]
        variant = np.mean([raw[(VARIANT, k)][task][s]["final"] for s in seeds])
        low, high = min(v["final"] for v in base.values()), max(v["final"] for v in base.values())
        where = "outside" if not low <= variant <= high else "inside"
        lines.append(f"| {task} | {np.mean(same):.0f} | {variant:.0f} | [{low:.0f}, {high:.0f}] | {where} |")
        if task in normalised.get((VARIANT, k), {}):
            shift.append(np.mean([normalised[(VARIANT, k)][task][s]["final"] for s in seeds])
                         - np.mean([normalised[(BASE, k)][task][s]["final"] for s in seeds if s in base]))
    if shift:
        lines += ["", "ε = 0.1 minus ε = 0.2 on the same seeds, normalised final score (1 = PPO at K = 1), mean over "
                  f"the {len(shift)} tasks: {np.mean(shift):+.2f} (from {min(shift):+.2f} to {max(shift):+.2f})."]
    return titled(f"GePPO's ε at K = {k}", "geppo_eps", lines + [""])
