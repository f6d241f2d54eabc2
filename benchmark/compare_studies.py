"""Two folders of study runs side by side, cell by cell (task, algorithm, K): the final return of
each, and whether the second one's mean lies inside the first one's 95 % interval of the mean.

    python benchmark/compare_studies.py benchmark/results/cpu-1m benchmark/results/cpu-1m-compiled \\
        --names eager compiled

Final return: the mean return of the episodes in the last 10 % of a run's env steps (as analyze.py
scores a run). The interval is Student's t over the first folder's seeds; only the cells both
folders ran are compared.
"""

import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import tyro
from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from analyze import load_runs, run_scores  # noqa: E402


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


def interval(values, confidence=0.95):
    mean, sem = np.mean(values), stats.sem(values)
    half = sem * stats.t.ppf((1 + confidence) / 2, len(values) - 1) if len(values) > 1 else np.inf
    return mean, mean - half, mean + half


def table(reference, other, names):
    lines = [f"| task | algorithm | K | {names[0]}: mean [95 % interval] (seeds) | {names[1]}: mean ± std (seeds) "
             f"| {names[1]} mean inside |", "|-|-|-|-|-|-|"]
    inside = 0
    cells = sorted(set(reference) & set(other))
    for cell in cells:
        mean, low, high = interval(reference[cell])
        theirs = np.array(other[cell])
        ok = low <= theirs.mean() <= high
        inside += ok
        lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {mean:.0f} [{low:.0f}, {high:.0f}] ({len(reference[cell])}) "
                     f"| {theirs.mean():.0f} ± {theirs.std():.0f} ({len(theirs)}) | {'yes' if ok else 'no'} |")
    lines += ["", f"{inside} of {len(cells)} cells: the {names[1]} mean lies inside the {names[0]} interval."]
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
