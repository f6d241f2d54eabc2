"""Lag and filter diagnostics per task: without lag and at the grid's largest K, VACO's beside PPO's, the rows where
VACO is behind PPO (its mean final return below PPO's) in bold, with the seed pairs VACO wins."""

import numpy as np

from benchmark.study.report import seeds_note, titled
from benchmark.study.scores import above_random_ratio, finals, logged_means, pairs_won


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    runs, raw, randoms, tasks, ks = study.runs, study.raw, study.randoms, study.compared, study.head_ks
    seeds = seeds_note(raw, [(a, k) for k in ks for a in ("ppo", "vaco")], tasks)
    lines = ["Means over runs and updates. *Pairs won*: of every pairing of a VACO seed with a PPO seed, those "
             "where VACO's final return is higher. *Filter on*: the share of minibatches whose TV exceeded δ; "
             "*filtered*: the share of samples detached; *KL*: approx KL(β ‖ π) per update; *backward TV*: TV "
             "between the learner and the behaviour policies at the update's start. Bold: VACO behind PPO at "
             "that K, i.e. its mean final return below PPO's." + seeds, "",
             "| task | K | VACO/PPO | pairs won | filter on | filtered | KL VACO | KL PPO | entropy VACO | "
             "entropy PPO | backward TV |", "|-|-|-|-|-|-|-|-|-|-|-|"]
    for task in tasks:
        for k in ks:
            ppo, vaco = finals(raw, ("ppo", k), task), finals(raw, ("vaco", k), task)
            if not (ppo and vaco):
                continue
            d, dp = logged_means(runs, ("vaco", k), [task]), logged_means(runs, ("ppo", k), [task])
            get = lambda diag, c: f"{diag[c]:.3g}" if c in diag else ""  # noqa: E731
            behind = np.mean(vaco) < np.mean(ppo)
            name = f"**{task}**" if behind else task
            lines.append(f"| {name} | {k} | {above_random_ratio(vaco, ppo, randoms[task]):.2f} | "
                         f"{pairs_won(vaco, ppo)}/{len(vaco) * len(ppo)} | {get(d, 'filter_on_fraction')} | "
                         f"{get(d, 'filtered_fraction')} | {get(d, 'approx_kl')} | "
                         f"{get(dp, 'approx_kl')} | {get(d, 'entropy')} | {get(dp, 'entropy')} | "
                         f"{get(d, 'backward_tv')} |")
    return titled("Lag and filter diagnostics per task", "diagnostics", lines + [""])
