"""A GPU smoke check of grpo_vaco_gsm8k.py's default path, sized for a short GPU lease (< 8 minutes):
a few training steps at N = 8 minibatches with each loss (clip, vaco, dppo-tv), then one loss
(`--stale-loss`, vaco) at `--staleness 4`, everything else at the script's defaults (bf16 autocast,
16 prompts x 8 completions, up to 512 new tokens, micro-batches of 16, activation checkpointing, lr
1e-6). For each run it reports the peak GPU memory, generation and training tokens per second, the
backward TV (at S = 4: from the second step on, the first steps training on batches of the initial
policy) and the TV of each minibatch k to μ, and writes them to `grpo_gpu_smoke.md` and `.json` in
`--out-dir` ($OUT when set, so that a remote run sends them back). A run is not started when it would
end past `--time-budget`.

    python benchmark/grpo/gpu_smoke.py                                   # on a machine with a GPU
    python benchmark/grpo/gpu_smoke.py --model-id DIR --dataset-path gsm8k_train.jsonl   # real weights, GSM8k
    python benchmark/grpo/gpu_smoke.py --tiny --device cpu               # the same code path in seconds (tests)

The model: `--model-id` when it can be loaded from a local folder or the local Hugging Face cache
(nothing is downloaded: GPU machines here reach no network). Otherwise a randomly initialised model
with Qwen2.5-0.5B-Instruct's architecture (24 layers, hidden 896, vocabulary 151,936, tied embeddings)
and a byte-level BPE tokenizer trained on the problems, so that memory and speed are those of the
real model's shapes. A random model never answers a problem, so it is given a stand-in reward
(1 for a completion of an even number of characters) to make the advantages, the updates and the
lag real; its TV figures describe a random model, not Qwen. It samples nearly uniformly from
151,936 tokens, of which the small tokenizer decodes 2,000 (the others decode to nothing), and it
never ends a completion: every completion is `--max-new-tokens` long, the most memory a step can take. The problems: `--dataset-path`, else
generated one-step arithmetic problems in GSM8k's format.
"""

import argparse
import glob
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, read_scalars  # noqa: E402
from benchmark.grpo.cpu_task import unique_problems  # noqa: E402

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2.5-0.5B-Instruct's config.json, the fields that set its shapes
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
# (vocab_size None: the tokenizer's own, so that every sampled token decodes to text)
TINY = dict(vocab_size=None, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)


def stand_in_reward(completion: str, gold_answer: str, mode: str = "strict", format_reward: float = 0.0) -> float:
    """The random model's reward: 1 for an even number of characters (about half the completions)."""
    return float(len(completion) % 2 == 0)


def random_model(folder: Path, problems: list, config: dict) -> Path:
    """A randomly initialised Qwen2 model of the given shape and a byte-level BPE tokenizer with a
    ChatML template, saved as a transformers folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tk.train_from_iterator([p["question"] + " " + p["answer"] for p in problems], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=CHATML)
    torch.manual_seed(0)
    config = {**config, "vocab_size": config["vocab_size"] or len(tokenizer)}
    model = Qwen2ForCausalLM(Qwen2Config(**config, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def loadable(model_id: str) -> bool:
    """True when the model's config is in a local folder or the local hub cache (no download)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model_id, local_files_only=True)
        return True
    except Exception:
        return False


def summarise(run_dir: str, n: int) -> dict:
    """Means over the steps of a run's TensorBoard log."""
    values = read_scalars(run_dir)
    out = {key: statistics.mean(values[f"perf/{key}"]) for key in ("gen_tokens_per_s", "train_tokens_per_s")}
    out.update(peak_memory_gib=max(values["perf/peak_memory_gib"]), steps=len(values["charts/reward_mean"]),
               tv_backward=values["lag/tv_backward"],
               completion_length=statistics.mean(values["charts/completion_length"]),
               reward=statistics.mean(values["charts/reward_mean"]),
               tv=[statistics.mean(values[f"lag/tv_minibatch_{k}"]) for k in range(n)],
               stale_tvs=[tv for k in range(1, n) for tv in values[f"lag/tv_minibatch_{k}"]],
               first_max_abs_log_ratio=values["lag/max_abs_log_ratio_minibatch_0"][0],
               first_tv=values["lag/tv_minibatch_0"][0],
               filter_on=[statistics.mean(values[f"lag/filter_on_minibatch_{k}"]) for k in range(n)],
               filtered=statistics.mean(values["losses/filtered_fraction"]),
               clipped=statistics.mean(values["losses/clip_fraction"]),
               masked=statistics.mean(values["losses/masked_fraction"]))
    return out


def round_to_one_figure(x: float) -> float:
    return float(f"{x:.0e}") if x > 0 else 0.0


def assumption_checks(results: list, default_delta: float) -> dict:
    """What only the run's own hardware can show, from its runs without staleness:
    - zero_lag_max_abs_log_ratio: the largest |log π_θ - log μ| over minibatch 0's tokens of the first step, before
      any optimiser step: 0 when the training pass (autocast, activation checkpointing, train mode) reproduces the
      log-probs the sampling pass stored, as "ρ = 1 exactly at zero lag" needs; zero_lag_tv: the TV it makes;
    - tv_calibration: the docs' δ rule on the run's own stale minibatches (k >= 1) of its `clip` run: δ = their
      median TV to one significant figure, beside the script's default."""
    fresh = [r for r in results if r["staleness"] == 0]
    if not fresh:
        return {}
    checks = {"zero_lag_max_abs_log_ratio": max(r["first_max_abs_log_ratio"] for r in fresh),
              "zero_lag_tv": max(r["first_tv"] for r in fresh)}
    clip = next((r for r in fresh if r["loss"] == "clip"), None)
    if clip and clip["stale_tvs"]:
        median = statistics.median(clip["stale_tvs"])
        checks["tv_calibration"] = {"loss": "clip", "stale_minibatches": len(clip["stale_tvs"]), "median_tv": median,
                                    "delta": round_to_one_figure(median), "default_delta": default_delta}
    return checks


def markdown(results: list, setting: str, command: str) -> str:
    n = max(len(r["tv"]) for r in results) if results else 0
    lines = ["# GPU smoke check of grpo_vaco_gsm8k.py", "", f"Command: `{command}`", "", setting, "",
             "| loss | S | steps | seconds | peak memory (GiB, allocated / reserved) | generation tok/s | training tok/s | "
             "completion length | filtered / clipped / masked | backward TV per step | "
             + " | ".join(f"TV k = {k}" for k in range(n)) + " |",
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * n]
    for r in results:
        reserved = f"{r['peak_reserved_gib']:.1f}" if r.get("peak_reserved_gib") is not None else "-"
        lines.append(f"| {r['loss']} | {r['staleness']} | {r['steps']} | {r['seconds']:.0f} | "
                     f"{r['peak_memory_gib']:.1f} / {reserved} | "
                     f"{r['gen_tokens_per_s']:.0f} | {r['train_tokens_per_s']:.0f} | {r['completion_length']:.0f} | "
                     f"{r['filtered']:.3f} / {r['clipped']:.3f} / {r['masked']:.4f} | "
                     + " ".join(f"{tv:.4f}" for tv in r["tv_backward"]) + " | "
                     + " | ".join(f"{tv:.5f}" for tv in r["tv"]) + " |")
    lines += ["", "Peak memory: `torch.cuda.max_memory_allocated` (reserved: `max_memory_reserved`) over the run, "
              "reset between losses; on a CPU, the process's peak resident memory. Training tokens/s counts prompt and "
              "completion tokens of μ's log-prob pass and the N training passes. TV: mean over the steps of "
              "`lag/tv_minibatch_k`; VACO's filter at the script's default δ. Backward TV: `lag/tv_backward` of each step, "
              "TV(μ, π_prox) on the batch's tokens."]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-id", default="Qwen/Qwen2.5-0.5B-Instruct",
                   help="a local folder or a model in the local hub cache; else a random model of Qwen2.5-0.5B's shape")
    p.add_argument("--dataset-path", default=None, help="a GSM8k-format JSONL file (default: generated problems)")
    p.add_argument("--losses", nargs="+", default=["clip", "vaco", "dppo-tv"])
    p.add_argument("--num-steps", type=int, default=3, help="training steps per loss")
    p.add_argument("--num-minibatches", type=int, default=8)
    p.add_argument("--staleness", type=int, default=4, help="S of the last run (0: no stale run)")
    p.add_argument("--stale-loss", default="vaco", help="the loss of the run at --staleness")
    p.add_argument("--time-budget", type=float, default=420.0,
                   help="seconds: no further loss is started when the last one would end past this")
    p.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(RESULTS, "tmp", "gpu_smoke"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: for the test of this script")
    p.add_argument("--tiny", action="store_true", help="a tiny random model and short completions (a CPU test)")
    p.add_argument("--extra", default="", help="more arguments for every run of grpo_vaco_gsm8k.py")
    a = p.parse_args()

    import torch
    import tyro

    import grpo_vaco_gsm8k as g

    start = time.time()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible (torch.cuda.is_available() is False); --device cpu runs the check on the CPU")
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="grpo_gpu_smoke."))
    problems = unique_problems(400)
    data = a.dataset_path
    if data is None:
        data = str(work / "problems.jsonl")
        Path(data).write_text("".join(json.dumps(q) + "\n" for q in problems))
    real = not a.tiny and loadable(a.model_id)
    if real:
        model_id, what = a.model_id, f"model {a.model_id} (its own weights)"
    else:
        model_id = str(random_model(work / "model", problems, TINY if a.tiny else QWEN25_05B))
        what = ("a tiny random Qwen2 model" if a.tiny else
                f"a random model of Qwen2.5-0.5B-Instruct's shape ({a.model_id} is not available locally)")
        g.gsm8k_reward = stand_in_reward  # train() scores with the module's reward: the stand-in
    argv = ["--model-id", model_id, "--dataset-path", data, "--num-steps", str(a.num_steps),
            "--num-minibatches", str(a.num_minibatches), "--eval-size", "0", "--no-eval-before", "--no-final-eval",
            "--num-logged-samples", "0", "--exp-name", "gpu_smoke"]
    if a.device == "cpu":
        argv += ["--no-cuda"]
    if a.tiny:
        argv += ["--num-prompts", "2", "--group-size", "4", "--max-new-tokens", "8", "--learning-rate", "1e-3"]
    argv += shlex.split(a.extra)
    setting = (f"Setting: {what}; problems from {a.dataset_path or 'generated arithmetic (GSM8k format)'}; device "
               f"{torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}; torch {torch.__version__}; every other "
               f"option at the script's default. Runs: `python grpo_vaco_gsm8k.py {shlex.join(argv)} --loss L --staleness S`.")
    print(setting, flush=True)

    results, skipped = [], []
    os.chdir(work)  # the runs' TensorBoard logs stay out of $OUT
    runs = [(loss, 0) for loss in a.losses] + ([(a.stale_loss, a.staleness)] if a.staleness else [])
    for loss, staleness in runs:
        label = loss if staleness == 0 else f"{loss} S{staleness}"
        spent = time.time() - start
        if results and spent + max(r["seconds"] for r in results) > a.time_budget:
            skipped.append(label)
            continue
        if a.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        result = g.train(tyro.cli(g.Args, args=argv + ["--loss", loss, "--staleness", str(staleness)]))
        (run_dir,) = glob.glob(str(work / "runs" / f"{result['run_name']}*"))
        r = {"loss": label, "staleness": staleness, "seconds": time.time() - t0, **summarise(run_dir, a.num_minibatches),
             "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if a.device == "cuda" else None}
        results.append(r)
        print(json.dumps(r), flush=True)
        write(out_dir, results, skipped, setting, g.Args.tv_threshold)  # after every loss: a cut run keeps what it measured
    text, checks = write(out_dir, results, skipped, setting, g.Args.tv_threshold)
    print(text, flush=True)
    if checks.get("zero_lag_max_abs_log_ratio", 0.0) > 0:
        print(f"warning: at zero lag the training pass's log-probs differ from the stored μ's by up to "
              f"{checks['zero_lag_max_abs_log_ratio']:.3g} (TV {checks['zero_lag_tv']:.3g}, against δ = "
              f"{g.Args.tv_threshold}): ρ = 1 does not hold exactly on this hardware", flush=True)
    print(f"total {time.time() - start:.0f} s; results in {out_dir}", flush=True)


def write(out_dir: Path, results: list, skipped: list, setting: str, default_delta: float):
    """grpo_gpu_smoke.md and .json in out_dir, with the time budget's cuts and the assumption checks."""
    command = shlex.join(["python", "benchmark/grpo/gpu_smoke.py", *sys.argv[1:]])
    setting += f" Not run (time budget): {', '.join(skipped)}." if skipped else ""
    checks = assumption_checks(results, default_delta)
    text = markdown(results, setting, command) + checks_markdown(checks)
    (out_dir / "grpo_gpu_smoke.md").write_text(text)
    (out_dir / "grpo_gpu_smoke.json").write_text(json.dumps({"setting": setting, "command": command, "results": results,
                                                             "skipped": skipped, **checks}, indent=1) + "\n")
    return text, checks


def checks_markdown(checks: dict) -> str:
    if not checks:
        return ""
    lines = ["", "## What the first run on this hardware must check", "",
             f"- Zero lag, minibatch 0 of the first step: largest |log π_θ − log μ| = "
             f"{checks['zero_lag_max_abs_log_ratio']:.3g}, TV = {checks['zero_lag_tv']:.3g}. VACO's \"ρ = 1 at zero lag\" "
             "needs 0; anything else is what the training pass's numerics (autocast, checkpointing, kernels) add to "
             "every TV the filter measures, to be set against δ."]
    if "tv_calibration" in checks:
        c = checks["tv_calibration"]
        lines.append(f"- The δ rule on this run's own stale minibatches ({c['stale_minibatches']} of the `clip` run, "
                     f"k ≥ 1): median TV {c['median_tv']:.3g}, so δ = {c['delta']:g}, against the script's default "
                     f"{c['default_delta']:g}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
