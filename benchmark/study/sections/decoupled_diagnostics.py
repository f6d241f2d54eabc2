"""Decoupled PPO and VACO under lag, at the grid's largest K, beside PPO: how each does and what each logs. Bold: the
tasks where they disagree, one ahead of PPO and the other behind it (mean final returns)."""

import numpy as np

from benchmark.study.report import titled
from benchmark.study.scores import above_random_ratio, finals, logged_means


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    raw, tasks, k = study.raw, study.compared, max(study.ks)
    if not any(finals(raw, ("ppo-decoupled", k), t) for t in tasks):
        return f"no run of decoupled PPO at K = {k}"
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
        d = {a: logged_means(study.runs, (a, k), [task]) for a in ("ppo", "vaco", "ppo-decoupled")}
        get = lambda a, c: f"{d[a][c]:.3g}" if c in d[a] else ""  # noqa: E731
        disagree = (np.mean(vaco) > np.mean(ppo)) != (np.mean(decoupled) > np.mean(ppo))
        random = study.randoms[task]
        cells = [f"{above_random_ratio(vaco, ppo, random):.2f}", f"{above_random_ratio(decoupled, ppo, random):.2f}",
                 get("ppo", "clipfrac"), get("ppo-decoupled", "clipfrac"), get("ppo-decoupled", "backward_ratio_mean"),
                 get("ppo-decoupled", "backward_ratio_max"), get("ppo", "approx_kl"), get("vaco", "approx_kl"),
                 get("ppo-decoupled", "approx_kl"), get("ppo", "entropy"), get("vaco", "entropy"),
                 get("ppo-decoupled", "entropy")]
        lines.append(f"| {f'**{task}**' if disagree else task} | " + " | ".join(cells) + " |")
    return titled("Decoupled PPO and VACO under lag", "decoupled_diagnostics", lines + [""])
