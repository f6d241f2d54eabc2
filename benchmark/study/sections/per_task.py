"""Final returns per task: every algorithm and K that ran, mean ± sample standard deviation over seeds (and their
number). Returns, not scores: it needs no run of synchronous PPO."""

import numpy as np

from benchmark.study.report import marked


def section(study):
    tasks = study.tasks
    lines = ["| algorithm | K | " + " | ".join(tasks) + " |", "|-|-|" + "-|" * len(tasks)]
    for key in study.keys:
        cells = []
        for task in tasks:
            finals = [s["final"] for s in study.raw.get(key, {}).get(task, {}).values()]
            spread = f" ± {np.std(finals, ddof=1):.0f}" if len(finals) > 1 else ""
            cells.append(f"{np.mean(finals):.0f}{spread} ({len(finals)})" if finals else "")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return ["## Final returns per task (mean ± sample std over seeds, number of seeds)", "",
            *marked("per_task", lines + [""])]
