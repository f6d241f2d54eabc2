"""VACO against PPO per task: PPO's and VACO's final return (mean and 95% t-interval over seeds) without lag and at
the grid's largest K, and their ratio above the random policy; the other methods under lag too, at the K where they
ran, except a block still running (named below the table)."""

from benchmark.study.presets import LAG_METHODS, method
from benchmark.study.report import incomplete_line, interval_cell, seeds_note, titled
from benchmark.study.scores import above_random_ratio, completeness, finals


def section(study):
    if not study.has_vaco:
        return "no run of VACO"
    raw, tasks, ks = study.raw, study.compared, study.head_ks
    running = {k: completeness(raw, [a for a in LAG_METHODS if (a, k) in raw], k, tasks, study.planned)[1] for k in ks}
    others = {k: [a for a in LAG_METHODS if a == "vaco" or ((a, k) in raw and a not in running[k])] for k in ks}
    header = ["task"]
    for k in ks:
        header += [f"PPO K={k}"] + [f"{method(a).name}{suffix} K={k}" for a in others[k] for suffix in ("", "/PPO")]
    x = "X" if any(len(names) > 1 for names in others.values()) else "VACO"
    seeds = seeds_note(raw, [key for k in ks for key in [("ppo", k)] + [(a, k) for a in others[k]]], tasks)
    lines = ["Final return (the episodes of the last 10% of steps): mean over seeds and its 95% Student-t "
             f"interval; {x}/PPO = ({x} − random) / (PPO − random) at the same K, above 1 when {x} is ahead."
             + seeds, "",
             "| " + " | ".join(header) + " |", "|" + "-|" * len(header)]
    for task in tasks:
        cells = []
        for k in ks:
            ppo = finals(raw, ("ppo", k), task)
            cells.append(interval_cell(ppo))
            for algorithm in others[k]:
                other = finals(raw, (algorithm, k), task)
                cells += [interval_cell(other),
                          f"{above_random_ratio(other, ppo, study.randoms[task]):.2f}" if ppo and other else ""]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += [""] + [line for k in ks for line in incomplete_line(running[k], k)]
    return titled("VACO against PPO per task", "vaco_vs_ppo", lines)
