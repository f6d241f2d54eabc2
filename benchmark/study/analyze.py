"""Analysis of a lag-robustness study (benchmark/study/run.py): the runs of one results folder, read and scored
once (a `Study`), then the report, an ordered list of sections, one module a question in sections/, each writing
its Markdown and drawing its figure. Writes report.md beside the runs (the docs include its sections by the names
of their snippet markers) and the figures.

    python benchmark/study/analyze.py benchmark/results/cpu
    python benchmark/study/analyze.py benchmark/results/cpu --figures-dir docs/img/study_cpu

The scores and their normalisation (0 = a random policy, 1 = synchronous PPO): scores.py; the intervals (rliable's
aggregates with 95% stratified-bootstrap intervals, seeded: the same CSVs always give the same report): estimates.py.
"""

import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.study.plotting import FigureFolder  # noqa: E402
from benchmark.study.presets import MAIN_ALGORITHMS, MORE_SEEDS, method, planned_runs  # noqa: E402
from benchmark.study.random_scores import load_random_scores, update_random_scores  # noqa: E402
from benchmark.study.scores import load_runs, ppo_references, score_table  # noqa: E402
from benchmark.study.sections import (aggregates, baselines, decoupled_diagnostics, diagnostics,  # noqa: E402
                                      figures, geppo_eps, improvement, lag_recovered, lag_scan, per_task, remedies,
                                      remedy_grid, summary_number, sweep, trust_region, vaco_vs_ppo, what_moved,
                                      which_script, window)

# The report, in order. A section returns its Markdown lines, or, when the folder has nothing for it, the one line
# that says why (printed, and left out of the report).
SECTIONS = [per_task, which_script, vaco_vs_ppo, lag_recovered, decoupled_diagnostics, trust_region, lag_scan, remedies,
            remedy_grid, geppo_eps, summary_number, what_moved, diagnostics, window, aggregates, improvement, baselines,
            sweep, figures]


@dataclass
class Study:
    """A folder's runs, read and scored once; every section of the report takes it."""
    folder: str  # the results folder
    runs: list  # [(meta, rows)] of every finished run: its JSON and the rows of its CSV
    randoms: dict  # {task: mean return of a uniformly random policy}, the 0 of the normalised scores
    raw: dict  # {(algorithm, K): {task: {seed: {"final", "auc"}}}} of the runs' returns
    normalised: dict  # the same, normalised: 0 = random, 1 = PPO at K = 1 (on the tasks where PPO ran at K = 1)
    tasks: list  # every task a run trained on
    keys: list  # every (algorithm, K) that ran, the main algorithms first
    ks: list  # the grid's lags: those at which PPO ran on every task (a larger K on fewer tasks is a lag scan)
    main_tasks: list  # the tasks where PPO and VACO ran at K = 1 and every K of the grid: the normalised comparisons
    compared: list  # the tasks where PPO or VACO ran at a K of the grid: the comparisons of returns
    planned: set  # {(task, algorithm, K, seed)} that the presets writing into this folder plan
    waiting: dict  # {(algorithm, K): (seeds, runs in, runs planned)} of added seeds not yet in on every task: left out
    added: frozenset  # {(task, algorithm, K, seed)} of the added seeds' runs, once they are in for all (what_moved)
    figures: FigureFolder  # where the figures go, and how the report links them
    reps: int = 2000  # bootstrap resamples
    seed: int = 0  # the bootstrap's seed
    window: Optional[int] = None  # the step inside longer runs that `window` reports at

    @property
    def grid_keys(self):
        """(algorithm, K) of the grid: at its lags."""
        return [key for key in self.keys if key[1] in self.ks]

    def first_seeds(self):
        """The same study on the seeds every method first ran: the runs of the added seeds left out, and out of the
        plan (what_moved.py sets its answers beside this one's)."""
        runs = [(meta, rows) for meta, rows in self.runs
                if (meta["task"], meta["algorithm"], meta["k"], meta["seed"]) not in self.added]
        return study_of(runs, self.randoms, self.folder, None, self.planned - self.added, self.reps, self.seed,
                        self.window)

    @property
    def head_ks(self):
        """No lag and the largest lag of the grid: where the per-task comparisons look."""
        return sorted({min(self.ks), max(self.ks)})

    @property
    def has_vaco(self):
        return any(a == "vaco" for a, _ in self.raw)


def seeds_still_running(runs, added):
    """{(algorithm, K, seed)} of the seeds that a preset adds to its blocks (`added`: planned runs of MORE_SEEDS) whose
    runs are not yet in on every task of every one of those blocks: a seed enters the comparison of the methods it
    adds to for all of them at once, so that they are always compared, and normalised, on the same seeds."""
    done = {(meta["task"], meta["algorithm"], meta["k"], meta["seed"]) for meta, _ in runs}
    running = {seed for *_, seed in added - done}
    return {(a, k, seed) for _, a, k, seed in added if seed in running}


def study_of(runs, randoms, folder=".", figures_dir=None, planned=frozenset(), reps=2000, seed=0, window=None,
             added=frozenset()):
    """The Study of `runs` ([(meta, rows)]) and the random policy's returns `randoms` ({task: mean}). Of the seeds that
    a preset adds to a block (`added`, planned runs), those not yet in on every task are left out, whole."""
    running = seeds_still_running(runs, added)
    runs_in = Counter((meta["algorithm"], meta["k"], meta["seed"]) for meta, _ in runs)
    runs_planned = Counter(p[1:] for p in added)
    waiting = {}
    for a, k, s in sorted(running):
        seeds, done, expected = waiting.get((a, k), ([], 0, 0))
        waiting[(a, k)] = (seeds + [s], done + runs_in[(a, k, s)], expected + runs_planned[(a, k, s)])
    runs = [(meta, rows) for meta, rows in runs if (meta["algorithm"], meta["k"], meta["seed"]) not in running]
    planned = {p for p in planned if p[1:] not in running}
    tasks = sorted({meta["task"] for meta, _ in runs})
    raw, normalised = score_table(runs, randoms)
    keys = sorted(raw, key=lambda key: (key[0] not in MAIN_ALGORITHMS, key[0], key[1]))
    all_ks = sorted({k for _, k in keys})
    ks = [k for k in all_ks if all(t in raw.get(("ppo", k), {}) for t in tasks)] or all_ks
    # normalised scores need synchronous PPO (K = 1) on the task; without it the report gives returns only
    main_tasks = [t for t in tasks if all(t in raw.get((a, k), {}) for a in ("ppo", "vaco") for k in {1, *ks})]
    compared = [t for t in tasks if any(raw.get((a, k), {}).get(t) for a in ("ppo", "vaco") for k in ks)]
    return Study(folder=folder, runs=runs, randoms=randoms, raw=raw, normalised=normalised, tasks=tasks, keys=keys,
                 ks=ks, main_tasks=main_tasks, compared=compared, planned=planned, waiting=waiting,
                 added=frozenset(p for p in added if p[1:] not in running),
                 figures=FigureFolder(figures_dir or folder, folder), reps=reps, seed=seed, window=window)


def load_study(results_dir, figures_dir=None, reps=2000, seed=0, window=None):
    """The Study of a results folder. A task without a random policy's return in its random_scores.json is
    measured first (benchmark/study/random_scores.py sets the precision)."""
    runs = load_runs(results_dir)
    tasks = sorted({meta["task"] for meta, _ in runs})
    stored = load_random_scores(results_dir)
    entries = update_random_scores(results_dir, [t for t in tasks if t not in stored], ppo_references(runs))
    randoms = {task: entry["mean"] for task, entry in entries.items()}
    return study_of(runs, randoms, results_dir, figures_dir, planned_runs(results_dir), reps, seed, window,
                    added=planned_runs(results_dir, MORE_SEEDS))


def header(study):
    waiting = [f"seed{'s' if len(seeds) > 1 else ''} {seed_range(seeds)} of {method(a).name} at K = {k} "
               f"({runs_in} of {runs_planned} runs in)" for (a, k), (seeds, runs_in, runs_planned) in study.waiting.items()]
    return [f"# Study results: {os.path.basename(os.path.abspath(study.folder))}", "",
            f"{len(study.runs)} finished runs. Random-policy returns: "
            + ", ".join(f"{t} {study.randoms[t]:.1f}" for t in study.tasks) + "."
            + ("" if ("ppo", 1) in study.raw else " No run of PPO at K = 1, so no normalised scores: returns only."), "",
            *([f"Still running, and in no number here until a seed is in for all of them on every task: "
               f"{'; '.join(waiting)}.", ""]
              if waiting else [])]


def seed_range(seeds):
    """4-10 for consecutive seeds, else 4, 6, 9."""
    consecutive = seeds == list(range(seeds[0], seeds[-1] + 1))
    return f"{seeds[0]}–{seeds[-1]}" if consecutive and len(seeds) > 2 else ", ".join(map(str, seeds))


def report(study):
    """The report's lines: its header, then each section of SECTIONS that has something to show."""
    lines = header(study)
    for section in SECTIONS:
        found = section.section(study)
        if isinstance(found, str):
            print(f"(no section {section.__name__.rsplit('.', 1)[-1]}: {found})")
        else:
            lines += found
    return lines


@dataclass
class Args:
    results_dir: tyro.conf.Positional[str]
    """a folder of study results (CSV + JSON per run), e.g. benchmark/results/cpu"""
    figures_dir: Optional[str] = None
    """where the PNG figures go (default: the results folder)"""
    reps: int = 2000
    """bootstrap resamples"""
    seed: int = 0
    """seed of the bootstrap: same CSVs and seed, same intervals"""
    window: Optional[int] = None
    """also report, for runs longer than this many env steps, their return in the last 10% before it
    (e.g. 1000000: what 3M-step runs reach at 0.9M-1M steps)"""


def main(args: Args):
    if not os.path.isdir(args.results_dir):
        sys.exit(f"error: {args.results_dir} is not a folder")
    study = load_study(args.results_dir, args.figures_dir, args.reps, args.seed, args.window)
    if not study.runs:
        sys.exit(f"error: no finished runs (JSON + CSV) in {args.results_dir}")
    os.makedirs(study.figures.folder, exist_ok=True)
    lines = report(study)
    path = os.path.join(args.results_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nreport: {path}; figures in {study.figures.folder}")


if __name__ == "__main__":
    main(tyro.cli(Args))
