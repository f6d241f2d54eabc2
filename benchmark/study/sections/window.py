"""Inside the runs: for runs longer than --window env steps (e.g. 3M-step runs at 1M steps), per task, algorithm and
K, the return of the episodes that ended between 0.9 and 1 x that many steps (mean over seeds and 95% t-interval)."""

from collections import defaultdict

from benchmark.study.presets import MAIN_ALGORITHMS
from benchmark.study.report import interval_cell, titled
from benchmark.study.scores import window_score


def section(study):
    end_step = study.window
    if not end_step:
        return "no --window given"
    scores = defaultdict(list)
    for meta, rows in study.runs:
        if meta["total_timesteps"] > end_step:
            scores[(meta["task"], meta["algorithm"], meta["k"])].append(window_score(rows, end_step))
    if not scores:
        return f"no run longer than {end_step:,} steps"
    keys = sorted({(a, k) for _, a, k in scores}, key=lambda key: (key[0] not in MAIN_ALGORITHMS, key))
    lines = [f"The return of the episodes that ended between {0.9 * end_step:,.0f} and {end_step:,.0f} env steps of "
             "these longer runs: mean over seeds and its 95% Student-t interval. The learning rate anneals to 0 "
             "over a run's length, so this is not what a run of that length reaches.", "",
             "| task | " + " | ".join(f"{a} K={k}" for a, k in keys) + " |", "|-|" + "-|" * len(keys)]
    for task in sorted({t for t, _, _ in scores}):
        lines.append(f"| {task} | " + " | ".join(interval_cell(scores.get((task, a, k), [])) for a, k in keys) + " |")
    return titled(f"Inside the runs, at {end_step:,} steps", "window", lines + [""])
