"""Two folders of study runs side by side, cell by cell (task, algorithm, K): the final return of
each, and whether each folder's mean lies inside the other's 95 % interval of the mean.

    python benchmark/study/compare.py benchmark/results/cpu-1m benchmark/results/cpu-1m-compiled \\
        --names eager compiled

Final return: the mean return of the episodes in the last 10 % of a run's env steps (as scores.py
scores a run). The intervals are Student's t over each folder's seeds; only the cells both
folders ran are compared.
"""

import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import t_interval  # noqa: E402
from benchmark.study.scores import load_runs, run_scores  # noqa: E402


@dataclass
class Args:
    reference: tyro.conf.Positional[str]
    """the folder whose intervals the other is judged against"""
    other: tyro.conf.Positional[str]
    """the folder compared with it"""
    names: list[str] = field(default_factory=lambda: ["reference", "other"])
    """the two folders' names in the table"""
    out: str = ""
    """also write the table to this Markdown file"""


def final_returns(folder):
    """{(task, algorithm, k): [final return of each seed]}."""
    cells = defaultdict(list)
    for meta, rows in load_runs(folder):
        cells[(meta["task"], meta["algorithm"], meta["k"])].append(run_scores(meta, rows)["final"])
    return cells


def interval(values):
    """Mean and the ends of its 95 % t-interval (common.t_interval); unbounded for one seed, which rules nothing out."""
    mean, (low, high) = t_interval(values)
    return (mean, low, high) if len(values) > 1 else (mean, -np.inf, np.inf)


def table(reference, other, names):
    """One row per cell both folders ran: each folder's mean with its 95 % interval, and whether
    each mean lies inside the other folder's interval (with 3 seeds a cell whose seeds happen to
    agree closely has a narrow interval, so the check is made both ways)."""
    lines = [f"| task | algorithm | K | {names[0]}: mean [95 % interval] (seeds) | {names[1]}: mean [95 % interval] "
             f"(seeds) | {names[1]} mean inside {names[0]} interval | {names[0]} mean inside {names[1]} interval |",
             "|-|-|-|-|-|-|-|"]
    inside, either = 0, 0
    cells = sorted(set(reference) & set(other))
    for cell in cells:
        mean, low, high = interval(reference[cell])
        theirs, their_low, their_high = interval(other[cell])
        ok, back = low <= theirs <= high, their_low <= mean <= their_high
        inside += ok
        either += ok or back
        shown = [f"{m:.0f} [{lo:.0f}, {hi:.0f}] ({len(v)})" if np.isfinite(hi) else f"{m:.0f} ({len(v)})"
                 for m, lo, hi, v in ((mean, low, high, reference[cell]), (theirs, their_low, their_high, other[cell]))]
        lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {shown[0]} | {shown[1]} | {'yes' if ok else 'no'} "
                     f"| {'yes' if back else 'no'} |")
    lines += ["", f"{inside} of {len(cells)} cells: the {names[1]} mean lies inside the {names[0]} interval; "
              f"{either} of {len(cells)}: at least one mean lies inside the other's interval."]
    return "\n".join(lines)


def main(args: Args):
    for folder in (args.reference, args.other):
        if not os.path.isdir(folder):
            sys.exit(f"error: {folder} is not a folder")
    text = table(final_returns(args.reference), final_returns(args.other), args.names)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main(tyro.cli(Args))
