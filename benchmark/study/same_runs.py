"""Do today's scripts train as those of a reference commit do, step for step? Each of the study's
algorithms (benchmark/study/presets.py), run as the study runs it (compiled, with lag), once with the scripts
as of the reference commit and once with today's, on this machine, with the same seed and flags; every
TensorBoard series the two runs share is compared exactly (wall-clock series such as SPS aside). A method runs
in the reference commit's spelling of it where that commit lacks today's script (presets.Method.earlier: decoupled
PPO as `ppo_continuous.py --clip-reference proximal` before decoupled_ppo_continuous.py).

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
from benchmark.study.presets import METHODS  # noqa: E402

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
    """the study's algorithms to compare (those whose script the reference commit lacks, in every spelling of the
    method, are left out, with a note)"""
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


def reference_spellings(names, reference, folder):
    """{name: (its script as of `reference`, written into `folder`, and its flags)}: each method in the first of its
    spellings (presets.Method.spellings) whose script that commit has, e.g. decoupled PPO at a commit before
    decoupled_ppo_continuous.py as `ppo_continuous.py --clip-reference proximal`. A method with none is left out,
    with a note."""
    paths, found = {}, {}
    for name in names:
        spellings = METHODS[name].spellings()
        for script, flags in spellings:
            if script not in paths:
                paths[script] = script_at(reference, script, folder)
            if paths[script]:
                found[name] = paths[script], flags
                break
        else:
            scripts = " or ".join(dict.fromkeys(script for script, _ in spellings))
            print(f"note: {name} left out: no {scripts} at {reference}", flush=True)
    return found


def main(args: Args):
    unknown = sorted(set(args.algorithms) - set(METHODS))
    if unknown:
        sys.exit(f"error: unknown algorithm(s) {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    retired = [name for name in args.algorithms if METHODS[name].retired_at]
    if retired:
        sys.exit(f"error: {', '.join(retired)}: retired, trained by the scripts as of "
                 f"{METHODS[retired[0]].retired_at}; today's scripts have no such method to compare")
    with tempfile.TemporaryDirectory() as folder:
        reference = reference_spellings(args.algorithms, args.reference, folder)
        args.algorithms = [name for name in args.algorithms if name in reference]
        if not args.algorithms:
            sys.exit(f"error: none of the scripts at {args.reference} (git, or that commit, is not at hand)")
        shared = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps), "--policy-buffer",
                  str(args.policy_buffer), "--seed", str(args.seed)] + ([] if args.compile else ["--no-compile"])
        jobs = []
        for name in args.algorithms:
            today = os.path.join(ROOT, METHODS[name].script), METHODS[name].flags
            for side, (path, flags) in (("reference", reference[name]), ("today", today)):
                cwd = os.path.join(folder, f"{name}-{side}")
                os.makedirs(cwd)
                jobs.append((name, side, path, [*flags, *shared], cwd))
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
