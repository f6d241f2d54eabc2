"""Do today's scripts train as those of a reference commit do, step for step? Each of the study's
algorithms (benchmark/study/presets.py), run as the study runs it (compiled, with lag), once with the scripts
as of the reference commit and once with today's, on this machine, with the same seed and flags; every
TensorBoard series the two runs share is compared exactly (wall-clock series such as SPS aside).

    python benchmark/study/same_runs.py --reference 91692b6 --env-id HalfCheetah-v4 --total-timesteps 20480

tests/test_same_results.py holds the scripts to the same on two tiny eager updates; this is its
check at the study's size and on its compiled path. Exits 1 if any run differs.
"""

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT, read_scalars, script_at  # noqa: E402
from benchmark.study.presets import ALGORITHMS  # noqa: E402

WALL_CLOCK = {"charts/SPS", "charts/updates_per_second"}  # series that depend on the machine's speed


@dataclass
class Args:
    reference: str
    """the commit whose scripts today's are held to (anything `git show` takes)"""
    env_id: str = "HalfCheetah-v4"
    """the task"""
    total_timesteps: int = 20480
    """env steps per run (10 updates of the default 2048)"""
    policy_buffer: int = 8
    """K: the lag the runs train under"""
    seed: int = 1
    """the runs' seed"""
    algorithms: list[str] = field(default_factory=lambda: ["ppo", "ppo-kl", "ppo-decoupled", "spo", "vaco",
                                                           "vaco-noalign", "vaco-nofilter", "vaco-none",
                                                           "vaco-proximal-0.1", "vtrace-decoupled", "geppo"])
    """the study's algorithms to compare (those whose script the reference commit lacks are left out, with a note)"""
    jobs: int = 2
    """runs at a time"""
    compile: bool = True
    """run the scripts compiled, as the study does (--no-compile: their eager path; the reference commit
    must know the flag)"""


def run(script, flags, cwd):
    """Run `script` with `flags` in `cwd`; returns its TensorBoard scalars."""
    result = subprocess.run([sys.executable, script, *flags], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: {script} {' '.join(flags)} failed:\n{result.stderr[-2000:]}")
    (run_dir,) = os.listdir(os.path.join(cwd, "runs"))
    return read_scalars(os.path.join(cwd, "runs", run_dir))


def compare(name, reference, today):
    """(name, series compared, [series that differ])."""
    shared = sorted((set(reference) & set(today)) - WALL_CLOCK)
    return name, len(shared), [tag for tag in shared if reference[tag] != today[tag]]


def main(args: Args):
    unknown = sorted(set(args.algorithms) - set(ALGORITHMS))
    if unknown:
        sys.exit(f"error: unknown algorithm(s) {', '.join(unknown)} (choose from {', '.join(ALGORITHMS)})")
    with tempfile.TemporaryDirectory() as folder:
        missing = {script for script in {ALGORITHMS[name][0] for name in args.algorithms}
                   if script_at(args.reference, script, folder) is None}
        for name in [name for name in args.algorithms if ALGORITHMS[name][0] in missing]:
            print(f"note: {name} left out: no {ALGORITHMS[name][0]} at {args.reference}", flush=True)
        args.algorithms = [name for name in args.algorithms if ALGORITHMS[name][0] not in missing]
        if not args.algorithms:
            sys.exit(f"error: none of the scripts at {args.reference} (git, or that commit, is not at hand)")
        jobs = []
        for name in args.algorithms:
            script, flags = ALGORITHMS[name]
            flags = [*flags, "--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps),
                     "--policy-buffer", str(args.policy_buffer), "--seed", str(args.seed)]
            if not args.compile:
                flags.append("--no-compile")
            for side, path in (("reference", os.path.join(folder, script)), ("today", os.path.join(ROOT, script))):
                cwd = os.path.join(folder, f"{name}-{side}")
                os.makedirs(cwd)
                jobs.append((name, side, path, flags, cwd))
        with ThreadPoolExecutor(args.jobs) as pool:
            scalars = dict(zip([(name, side) for name, side, *_ in jobs],
                               pool.map(lambda job: run(*job[2:]), jobs)))
    failed = False
    for name in args.algorithms:
        name, count, differ = compare(name, scalars[(name, "reference")], scalars[(name, "today")])
        failed |= bool(differ) or count == 0
        print(f"{name:20s} {count} series compared: " + (f"DIFFER in {', '.join(differ)}" if differ else
                                                          "identical" if count else "none shared"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(tyro.cli(Args))
