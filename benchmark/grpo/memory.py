"""Peak memory of one training micro-batch of grpo_vaco_gsm8k.py: `completion_logprobs` (with the
entropy, as in training) forward and backward, on a mid-sized random Qwen2 model with Qwen2.5's
vocabulary (151,936 tokens), whose [rows, C, vocab] logits dominate, as in the real 0.5B model.

On the CPU the peak is the growth of the process's peak resident memory (ru_maxrss) over its resident
memory just before the pass; `--autocast bf16` runs the pass under CPU bf16 autocast, the dtype path of
a GPU run. Each measurement runs in a fresh process. `--baseline-rev REV` also measures the script as
it was at git revision REV, for a before/after table.

    python benchmark/grpo/memory.py --baseline-rev 4b6add0

Writes benchmark/results/grpo_memory.md (or `--out`)."""
import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import RESULTS, ROOT, import_script, script_at  # noqa: E402


def measure(script: str, autocast: str, rows: int, prompt_len: int, completion_len: int, hidden: int, layers: int,
            device: str) -> dict:
    """One forward + backward pass of `completion_logprobs` from `script`; returns the peak in MiB."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    module = import_script(script, "grpo_script")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(device)
    model.gradient_checkpointing_enable() if not hasattr(model, "activation_checkpointing_enable") else model.activation_checkpointing_enable()
    model.train()
    ids = torch.randint(0, config.vocab_size, (rows, prompt_len + completion_len), device=device)
    attention_mask = torch.ones_like(ids)
    mask = torch.ones(rows, completion_len, device=device)
    context = torch.autocast(device, dtype=torch.bfloat16) if autocast == "bf16" else torch.autocast(device, enabled=False)
    with context:  # a first small pass, so that one-time allocations are not counted
        module.completion_logprobs(model, ids[:1, :8], attention_mask[:1, :8], 4, 0.7, with_entropy=True)[0].sum().backward()
    model.zero_grad(set_to_none=False)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    t0 = time.time()
    with context:
        logprobs, entropy = module.completion_logprobs(model, ids, attention_mask, completion_len, 0.7, with_entropy=True)
        loss = -(logprobs * mask).sum() / mask.sum()
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    elements = rows * completion_len * config.vocab_size
    return {"peak_mib": peak / 2**20, "bytes_per_logit": peak / elements, "logits_mib_fp32": elements * 4 / 2**20,
            "seconds": time.time() - t0, "logprob_sum": logprobs.sum().item(), "entropy_mean": entropy.mean().item()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-rev", default=None, help="also measure grpo_vaco_gsm8k.py at this git revision")
    p.add_argument("--rows", type=int, default=4, help="sequences in the micro-batch")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--autocast", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=os.path.join(RESULTS, "grpo_memory.md"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    shape = dict(rows=a.rows, prompt_len=a.prompt_len, completion_len=a.completion_len, hidden=a.hidden,
                 layers=a.layers, device=a.device)
    if a.child:  # one measurement, in this fresh process
        script, autocast = json.loads(a.child)
        print(json.dumps(measure(script, autocast, **shape)))
        return

    scripts = [("this version", os.path.join(ROOT, "grpo_vaco_gsm8k.py"))]
    if a.baseline_rev:
        old = script_at(a.baseline_rev, "grpo_vaco_gsm8k.py", tempfile.mkdtemp())
        if old is None:
            sys.exit(f"error: cannot read grpo_vaco_gsm8k.py at revision {a.baseline_rev} (git, or that revision, "
                     "is not at hand)")
        scripts.insert(0, (f"revision {a.baseline_rev}", old))
    lines = ["# Peak memory of one training micro-batch (grpo_vaco_gsm8k.py `completion_logprobs`, forward + backward)", "",
             "Command: `" + shlex.join(["python", "benchmark/grpo/memory.py", *sys.argv[1:]]) + "`", "",
             f"Model: random Qwen2, vocabulary 151,936 (Qwen2.5's), hidden {a.hidden}, {a.layers} layers, activation "
             f"checkpointing on. Micro-batch: {a.rows} sequences of {a.prompt_len} prompt + {a.completion_len} completion "
             f"tokens, T = 0.7. Device: {a.device}" + (", one thread; peak = growth of the peak resident memory over the "
                                                       "resident memory before the pass" if a.device == "cpu" else
                                                       "; peak = torch.cuda.max_memory_allocated over the allocated memory before the pass") + ".", "",
             "| script | compute dtype | peak (MiB) | bytes per logit element | seconds | check: Σ log-probs, mean entropy |",
             "|---|---|---|---|---|---|"]
    for name, script in scripts:
        for autocast in a.autocast:
            argv = [sys.executable, __file__, "--child", json.dumps([script, autocast])]
            argv += [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"error: measurement failed: {result.stderr.strip().splitlines()[-1]}")
            r = json.loads(result.stdout.strip().splitlines()[-1])
            print(json.dumps({"script": name, "autocast": autocast, **r}), flush=True)
            dtype = "fp32" if autocast == "fp32" else "bf16 autocast"
            lines.append(f"| {name} | {dtype} | {r['peak_mib']:.0f} | {r['bytes_per_logit']:.1f} | {r['seconds']:.1f} | "
                         f"{r['logprob_sum']:.2f}, {r['entropy_mean']:.4f} |")
    lines += ["", f"One fp32 copy of these logits is {r['logits_mib_fp32']:.0f} MiB (4 bytes per element)."]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
