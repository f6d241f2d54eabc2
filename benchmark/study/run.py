"""The lag-robustness study: algorithm x policy lag K x task x seed, one subprocess per run; the grids, its presets,
are in presets.py.

    python benchmark/study/run.py --preset cpu                # ~3 h on 2 cores; resumes where it stopped
    python benchmark/study/run.py --preset cpu --list         # one shell command per run (for any scheduler)
    python benchmark/study/run.py --preset paper --shard 3/100   # the 3rd of 100 slices (e.g. a Slurm array)
    python benchmark/study/run.py --preset ten-tasks --time-limit 2h45m   # only runs that can end within it
    python benchmark/study/analyze.py benchmark/results/cpu     # aggregates, tables and figures

Each run trains one top-level script in a scratch folder, then keeps only a small CSV of its
learning curve and lag diagnostics (one row per update) and a JSON of its exact command, the code it
ran (the commit, and the Python files that differed from it) and the machine it ran on (CPU model, cores):

    benchmark/results/<preset>/<task>__<algorithm>__K<k>__s<seed>.csv / .json

The JSON is written last, so a run counts as finished when it exists and holds the same command.
Re-running skips finished runs: an interrupted study resumes where it stopped. A finished run
whose command has changed (e.g. an algorithm's flags were edited) is moved to `stale/` and run again;
one recorded with an earlier spelling of its method (presets.Method.earlier: decoupled PPO was
`ppo_continuous.py --clip-reference proximal`) is the same training, and stays. A retired method, whose flags
the scripts have dropped (presets.Method.retired_at), trains with its script as of the last commit that
had them, written into the run's scratch folder; its JSON records the same command, and that commit.
A run stopped halfway is lost, so a sitting with a fixed end (a Slurm job's wall time, a shared
machine's booking) should pass `--time-limit`: the study then starts only runs that it expects to
end in time, shorter ones first once the next in line would not, and exits when none fits.
"""

import bisect
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, ROOT, move_stale, script_at, tensorboard_log, write_csv  # noqa: E402
from benchmark.study.presets import FOLDERS, METHODS, PRESETS, grid, method, training_command  # noqa: E402

# Per-update columns of the CSV: TensorBoard tag -> column. Missing tags are left empty.
DIAGNOSTICS = {
    "charts/policy_lag_mean": "policy_lag_mean",
    "charts/backward_tv": "backward_tv",
    "charts/backward_ratio_mean": "backward_ratio_mean",
    "charts/backward_ratio_max": "backward_ratio_max",
    "losses/approx_kl": "approx_kl",
    "losses/tv_divergence": "tv_divergence",
    "losses/clipfrac": "clipfrac",
    "losses/filtered_fraction": "filtered_fraction",
    "losses/filter_on_fraction": "filter_on_fraction",
    "losses/filter_tv": "filter_tv",
    "losses/entropy": "entropy",
    "losses/proximal_tv": "proximal_tv",
    "charts/update_tv": "update_tv",
    "charts/actor_learning_rate": "actor_learning_rate",
    "charts/update_kl": "update_kl",
}
COLUMNS = ["step", "episodes", "return_mean"] + list(DIAGNOSTICS.values())


def find_twin(run, out_dir):
    """A finished run in out_dir that trained exactly as `run` would (another name, same training
    command, in any spelling of the method's), e.g. "vaco" and the sweep variant whose flags it shares.
    None if there is none."""
    targets = {training_command(command) for command in run.portable_commands()}
    for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
        with open(path) as f:
            meta = json.load(f)
        if "command" in meta and training_command(meta["command"]) in targets:
            return path[: -len(".json")]
    return None


def select(runs, algorithms=None, tasks=None, ks=None, shard=None, seeds=None):
    """Filter by algorithm / task / K / seed, then keep the I-th of N interleaved slices (shard = "I/N", 1-based)."""
    runs = [r for r in runs if (not algorithms or r.algorithm in algorithms) and (not tasks or r.task in tasks)
            and (not ks or r.k in ks) and (not seeds or r.seed in seeds)]
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        runs = runs[i - 1 :: n]
    return runs


def is_finished(run, out_dir):
    """True when the run's JSON exists and records the same command, today's or an earlier spelling of the
    method's (decoupled PPO's runs as `ppo_continuous.py --clip-reference proximal`)."""
    path = os.path.join(out_dir, run.name + ".json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return json.load(f)["command"] in run.portable_commands()


def curve_rows(run_dir):
    """One row per update from a run's TensorBoard log: the episodes that ended during the update's
    rollout (count and mean return) and the update's diagnostics."""
    log = tensorboard_log(run_dir)
    tags = set(log.Tags()["scalars"])
    update_steps = [e.step for e in log.Scalars("charts/SPS")]  # logged once per update
    rows = [{"step": s, "episodes": 0, "return_sum": 0.0} for s in update_steps]
    for event in log.Scalars("charts/episodic_return") if "charts/episodic_return" in tags else []:
        i = min(bisect.bisect_left(update_steps, event.step), len(rows) - 1)
        rows[i]["episodes"] += 1
        rows[i]["return_sum"] += event.value
    for tag, column in DIAGNOSTICS.items():  # each logged once per update, in update order
        for row, event in zip(rows, log.Scalars(tag) if tag in tags else []):
            row[column] = event.value
    for row in rows:
        total = row.pop("return_sum")
        row["return_mean"] = total / row["episodes"] if row["episodes"] else ""
    return rows


def code_version():
    """The code a run trains with: the repository's commit and the Python files that differ from it
    (uncommitted edits; an empty list when the run is exactly that commit's code). None outside git."""
    def git(*words):
        return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        modified = git("diff", "--name-only", "HEAD", "--", "*.py").split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return dict(commit=commit, modified=modified)


def machine():
    """The machine a run trains on: its CPU's model name (as /proc/cpuinfo gives it, else the platform's) and its
    core count. Wall times, not numbers, depend on it."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return dict(cpu=cpu, cores=os.cpu_count())


def write_meta(run, out_dir, code, **extra):
    """The run's JSON: its command, its place in the grid, the code it ran (`code_version`) and `extra`."""
    meta = dict(command=run.portable_command(), task=run.task, algorithm=run.algorithm, k=run.k,
                seed=run.seed, total_timesteps=run.steps, code=code, **extra)
    path = os.path.join(out_dir, run.name + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(path + ".tmp", path)  # written last: its presence marks the run finished


def execute(run, out_dir):
    """Train one run in a scratch folder; keep its CSV and JSON, drop the rest. A run that another
    process (a shard, a second study) finished meanwhile is skipped, and one whose twin (same training
    command) has finished reuses the twin's results. A retired method trains with its script as of its commit
    (`retired_script`). Returns seconds taken."""
    start = time.time()
    if is_finished(run, out_dir):
        return 0.0
    move_stale(run.name, out_dir)
    twin = find_twin(run, out_dir)
    if twin:
        shutil.copyfile(twin + ".csv", os.path.join(out_dir, run.name + ".csv"))
        with open(twin + ".json") as f:
            trained_by = json.load(f).get("code")  # the code the twin trained with
        write_meta(run, out_dir, code=trained_by, same_training_as=os.path.basename(twin), seconds=0.0)
        return 0.0
    scratch = tempfile.mkdtemp(prefix=run.name + ".", dir=os.path.join(RESULTS, "tmp"))
    code = code_version()  # as the run starts: an edit made while it trains is not its code
    retired_at = method(run.algorithm).retired_at
    retired = {"script_as_of": retired_at} if retired_at else {}  # in the JSON: the commit whose script trained it
    try:
        script = retired_script(run, scratch) if retired_at else None  # None: today's script
        proc = subprocess.run(run.command(script), cwd=scratch, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{run.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        (run_dir,) = glob.glob(os.path.join(scratch, "runs", "*"))
        write_csv(os.path.join(out_dir, run.name + ".csv"), curve_rows(run_dir), COLUMNS)
        write_meta(run, out_dir, code=code, machine=machine(), seconds=round(time.time() - start, 1),
                   finished=time.strftime("%Y-%m-%d %H:%M:%S"), **retired)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.time() - start


def retired_script(run, folder):
    """The script of a retired method, as of the commit that had its flags, written into `folder`: its path."""
    m = method(run.algorithm)
    path = script_at(m.retired_at, m.script, folder)
    if path is None:
        raise RuntimeError(f"{run.name}: {run.algorithm} is retired and trains with {m.script} as of {m.retired_at}, "
                           "which git cannot show here (no git, or a clone without that commit)")
    return path


def format_duration(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def seconds_per_step(out_dir, statistic=statistics.fmean):
    """{task: wall seconds per env step} of the runs finished in `out_dir` (their mean, or another
    `statistic` of them), read from their JSONs, whichever sitting trained them (a reused twin took
    no time and is left out)."""
    rates = {}
    for path in glob.glob(os.path.join(out_dir, "*__*.json")):
        with open(path) as f:
            meta = json.load(f)
        if meta.get("seconds"):
            rates.setdefault(meta["task"], []).append(meta["seconds"] / meta["total_timesteps"])
    return {task: statistic(r) for task, r in rates.items()}


def expected_seconds(runs, rates):
    """Wall seconds `runs` should take one at a time: each at its task's rate, or at the mean rate of
    the tasks measured so far; None before any run has finished."""
    if not rates:
        return None
    overall = sum(rates.values()) / len(rates)
    return sum(run.steps * rates.get(run.task, overall) for run in runs)


def next_that_fits(queue, slowest, seconds_left):
    """The first run of `queue` expected to end within `seconds_left`, each task taken at the slowest
    pace a finished run of it has shown (a task not yet run at the slowest of any); None if none
    fits. Without a limit (None), or before any run has been timed, the first run."""
    if seconds_left is not None and seconds_left <= 0:
        return None
    if seconds_left is None or not slowest:
        return queue[0] if queue else None
    worst = max(slowest.values())
    return next((run for run in queue if run.steps * slowest.get(run.task, worst) <= seconds_left), None)


def parse_duration(text):
    """Seconds in a duration written like 2h45m, 90m or 30s."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not text or not match:
        raise ValueError(text)
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return 3600 * hours + 60 * minutes + seconds


@dataclass
class Args:
    preset: str = "cpu"
    """which grid: cpu (~3 h on 2 cores, 300k steps per run), cpu-1m (finalists and held-out tasks
    at 1M steps), ten-tasks (PPO and VACO at K 1 and 8 on the paper's 10 tasks, then decoupled PPO at
    K 8; 3 seeds, 1M steps), ten-tasks-proximal (VACO with --tv-reference proximal at K 8, same grid),
    ten-tasks-trust-region (V-trace with the decoupled clip and GePPO at K 8, same grid; then GePPO with GAE),
    ten-tasks-k32 (PPO, VACO, decoupled PPO and V-trace with the decoupled clip at K 32 on Ant, HalfCheetah,
    Hopper and Walker2d), ten-tasks-geppo-eps (GePPO with eps 0.1 at K 8, seed 1 of the ten tasks),
    ten-tasks-k32-remedies (decoupled PPO with an exact-KL stop, and GePPO with GAE, at K 32 on the same four
    tasks), ten-tasks-k32-screen (decoupled PPO without its stale samples, and V-trace + decoupled clip with the KL
    stop, seed 1 of the same), ten-tasks-kl-stop (decoupled PPO with the KL stop at K 8 on the ten tasks and at K 1
    on the four), ten-tasks-ten-seeds (seeds 4 to 10 of synchronous PPO, and of PPO, VACO and decoupled PPO at K 8,
    on the ten tasks), ant-3m (PPO and VACO on Ant-v4 at K 8, 3 seeds, 3M steps), paper (10 tasks x every algorithm x
    K in 1,2,4,8 x 10 seeds at 1M steps)"""
    jobs: int = os.cpu_count() or 1
    """runs at a time (each run uses one core)"""
    shard: Optional[str] = None
    """I/N: run only the I-th of N interleaved slices of the grid (1-based), e.g. a Slurm array task"""
    algorithms: Optional[list[str]] = None
    """run only these algorithms of the preset"""
    tasks: Optional[list[str]] = None
    """run only these tasks of the preset"""
    ks: Optional[list[int]] = None
    """run only these policy lags K of the preset"""
    seeds: Optional[list[int]] = None
    """run only these seeds of the preset (e.g. two seeds of every run first, the third later)"""
    out_dir: Optional[str] = None
    """where results go (default benchmark/results/<the preset's folder>: its name, or FOLDERS')"""
    total_timesteps: Optional[int] = None
    """override the preset's env steps per run (a dry run: use it with a separate --out-dir)"""
    time_limit: Optional[str] = None
    """wall time this sitting may take, e.g. 2h45m (a little under a Slurm job's): start only runs
    expected to end in time, each task at the slowest pace its finished runs have shown"""
    list: bool = False  # (last: the name shadows the builtin `list` in the annotations after it)
    """print one shell command per run (from the repository root) and exit; a retired method's first has git
    write its script as of its commit into a temporary folder"""


def check_args(args):
    if args.preset not in PRESETS:
        sys.exit(f"error: unknown preset '{args.preset}' (choose from {', '.join(PRESETS)})")
    unknown = sorted(set(args.algorithms or []) - set(METHODS))
    if unknown:
        sys.exit(f"error: unknown algorithm(s) {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    if args.shard:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
        except ValueError:
            sys.exit(f"error: --shard must look like I/N, e.g. 3/10, got '{args.shard}'")
        if not 1 <= i <= n:
            sys.exit(f"error: --shard {args.shard}: need 1 <= I <= N")
    if args.jobs < 1:
        sys.exit(f"error: --jobs must be >= 1, got {args.jobs}")
    if args.time_limit is not None:
        try:
            limit = parse_duration(args.time_limit)
        except ValueError:
            sys.exit(f"error: --time-limit must look like 2h45m, 90m or 30s, got '{args.time_limit}'")
        if limit <= 0:
            sys.exit(f"error: --time-limit must be more than 0, got '{args.time_limit}'")


def main(args: Args):
    check_args(args)
    runs = select(grid(args.preset, args.total_timesteps), args.algorithms, args.tasks, args.ks, args.shard, args.seeds)
    if args.list:
        print("\n".join(run.listed_command() for run in runs))
        return
    out_dir = args.out_dir or os.path.join(RESULTS, FOLDERS.get(args.preset, args.preset))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(RESULTS, "tmp"), exist_ok=True)
    todo = [run for run in runs if not is_finished(run, out_dir)]
    expected = expected_seconds(todo, seconds_per_step(out_dir))
    print(f"[study {args.preset}] {len(runs)} runs, {len(runs) - len(todo)} already finished, "
          f"{len(todo)} to go, {args.jobs} at a time -> {out_dir}"
          + (f" | ETA {format_duration(expected / args.jobs)} at the finished runs' pace" if expected else "")
          + (f" | time limit {args.time_limit}" if args.time_limit else ""), flush=True)
    done, failed, start = 0, [], time.time()
    deadline = start + parse_duration(args.time_limit) if args.time_limit else None
    with ThreadPoolExecutor(args.jobs) as pool:
        pending = {}  # future -> (run, when it started)
        queue = list(todo)
        while queue or pending:
            while len(pending) < args.jobs:
                seconds_left = None if deadline is None else deadline - time.time()
                run = next_that_fits(queue, seconds_per_step(out_dir, max), seconds_left)
                if run is None:
                    break
                queue.remove(run)
                pending[pool.submit(execute, run, out_dir)] = run, time.time()
            if not pending:  # runs are left, and none is expected to end before the time limit
                print(f"[study {args.preset}] time limit: {len(queue)} run(s) left for the next sitting, "
                      f"none expected to end in the {format_duration(max(0.0, seconds_left))} left", flush=True)
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                run, _ = pending.pop(future)
                try:
                    future.result()
                    done += 1
                except Exception as error:  # one failed run must not stop the study
                    failed.append(run.name)
                    print(f"error: {error}", flush=True)
                # each task at its own pace (a Humanoid run takes several Hopper runs' time); the runs
                # under way count for what they have left
                rates, left = seconds_per_step(out_dir), 0.0
                if rates:
                    under_way = [max(0.0, expected_seconds([r], rates) - (time.time() - t))
                                 for r, t in pending.values()]
                    left = expected_seconds(queue, rates) + sum(under_way)
                print(f"[study {args.preset}] {done + len(failed)}/{len(todo)} done ({len(failed)} failed) | "
                      f"last {run.name} | elapsed {format_duration(time.time() - start)} | "
                      f"ETA {format_duration(left / args.jobs)}", flush=True)
    if failed:
        sys.exit(f"error: {len(failed)} run(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(tyro.cli(Args))
