# GRPO for an LLM on GSM8k with PPO-clip or VACO's total-variation token filter, under forward lag.
# Reference: "Align and Filter: Improving Performance in Asynchronous On-Policy RL" (arXiv 2603.01365).
# Docs: docs/grpo_vaco_gsm8k.md
#
# One training step:
#   1. sample `num_prompts` problems and G = `group_size` completions for each, with the current
#      policy π_θ0 (the behaviour policy μ), at temperature T;
#   2. score each completion with a verifiable 0/1 reward and turn rewards into group-relative
#      advantages (GRPO);
#   3. record μ's per-token log-probs (same temperature, same code path as training);
#   4. split the batch into N = `num_minibatches` minibatches and take ONE optimiser step on each.
#      Minibatch k is trained by π_θk, a policy k optimiser steps newer than μ: this is the
#      "forward lag" of the paper. PPO-clip copes with it by clipping the ratio ρ = π_θk/μ;
#      VACO measures the lag as a total-variation distance and, when it is above δ, filters the
#      tokens whose update would push π even further from μ.
import json
import math
import os
import random
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, Literal, Optional

import numpy as np
import torch
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, a GPU is used when one is available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    save_model: bool = False
    """whether to save the trained model and tokenizer (with `save_pretrained`) at the end"""
    save_path: Optional[str] = None
    """where `--save-model` writes; default `runs/<run_name>/model`. Must not exist yet"""
    num_threads: int = 0
    """CPU threads for torch (0 = torch's default)"""

    # Model and data
    model_id: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """a model on the Hugging Face hub or a local directory (model + tokenizer)"""
    dataset_id: str = "openai/gsm8k"
    """the dataset on the hub (used when `--dataset-path` is not given)"""
    dataset_config: str = "main"
    """the configuration of the hub dataset"""
    dataset_path: Optional[str] = None
    """a local JSONL file with `question`/`answer` fields in GSM8k's format (answer ends with `#### N`);
    `eval_size` problems are held out from it for evaluation"""
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."
    """appended to each question in the user message of the chat template"""

    # GRPO
    loss: Literal["clip", "vaco"] = "vaco"
    """the policy loss: `clip` (GRPO's PPO-clip) or `vaco` (VACO's TV token filter)"""
    num_steps: int = 200
    """number of training steps (one generation batch each)"""
    num_prompts: int = 16
    """problems sampled per step"""
    group_size: int = 8
    """completions sampled per problem (G); advantages are relative to the group"""
    num_minibatches: int = 4
    """N: optimiser steps per generation batch. Minibatch k is trained k steps after generation (forward lag)"""
    micro_batch_size: int = 16
    """sequences per forward/backward pass (gradient accumulation inside a minibatch); 0 = whole minibatch"""
    learning_rate: float = 1e-6
    """the learning rate of the AdamW optimizer"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """the maximum norm for the gradient clipping"""
    temperature: float = 1.0
    """sampling temperature; the log-probs of the loss use the same temperature"""
    max_new_tokens: int = 512
    """maximum completion length in tokens"""
    clip_coef: float = 0.2
    """`clip`: the surrogate clipping coefficient ε"""
    tv_threshold: float = 0.05
    """`vaco`: δ, the total-variation level above which tokens are filtered (not from the paper: tune it)"""
    beta: float = 0.0
    """coefficient of the k3 KL penalty to the initial model (0 = off; no reference model is kept)"""
    format_reward: float = 0.0
    """extra reward for a completion that contains a \\boxed{} answer (0 = off)"""
    adv_eps: float = 1e-4
    """ε in the group advantage (r - mean) / (std + ε)"""
    gradient_checkpointing: bool = True
    """recompute activations in the backward pass to save memory (slower; matters on GPU for 0.5B models)"""

    # Evaluation
    eval_every: int = 20
    """evaluate every this many steps (0 = only before and after training)"""
    eval_size: int = 200
    """number of held-out test problems for greedy accuracy (0 = no evaluation)"""
    eval_batch_size: int = 64
    """prompts per greedy generation call during evaluation"""


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2, no traceback."""


# ----------------------------------------------------------------------------------------------
# Answers and rewards
# ----------------------------------------------------------------------------------------------
NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _last_boxed(text: str) -> Optional[str]:
    """Content of the last complete \\boxed{...} (nested braces allowed), else None."""
    result = None
    start = text.find("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:  # an unclosed \boxed{ (a truncated completion) does not count
            result = text[start + len("\\boxed{") : i - 1]
        start = text.find("\\boxed{", start + 1)
    return result


def _clean(answer: str) -> str:
    """Strip what is not part of a number's value: spaces, $, commas, a trailing full stop, \\text{}."""
    answer = re.sub(r"\\text\{([^{}]*)\}", r"\1", answer)
    for junk in ("\\$", "$", "\\!", "\\,", ",", "\\%", "%"):
        answer = answer.replace(junk, "")
    answer = answer.strip().rstrip(".").strip()
    if NUMBER_RE.fullmatch(answer):
        return answer
    numbers = NUMBER_RE.findall(answer)
    # "18 dollars" -> "18"; anything with several numbers ("\frac{1}{2}") stays as text
    return numbers[0].replace(",", "").rstrip(".") if len(numbers) == 1 else answer


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a completion: the last \\boxed{...}, else a `#### N` line, else the last
    number. Commas, `$` and a trailing `.` are stripped. None when there is no answer at all."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return _clean(boxed)
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return _clean(hashes[-1])
    numbers = NUMBER_RE.findall(text)
    if numbers:
        return _clean(numbers[-1])
    return None


def answers_equal(predicted: Optional[str], gold: Optional[str]) -> bool:
    """Numeric equality when both parse as numbers ("18.50" == "18.5"), else exact text equality."""
    if predicted is None or gold is None:
        return False
    try:
        p, g = float(predicted), float(gold)
        return math.isfinite(p) and abs(p - g) <= 1e-6 * max(1.0, abs(g))
    except ValueError:
        return predicted.strip() == gold.strip()


def gsm8k_reward(completion: str, gold_answer: str, format_reward: float = 0.0) -> float:
    """1 if the completion's final answer equals the gold answer numerically, else 0; plus
    `format_reward` when the completion puts an answer in \\boxed{}. `gold_answer` may be a bare
    number or a GSM8k answer text ending in `#### N`. Malformed completions simply score 0."""
    correct = answers_equal(extract_answer(completion), extract_answer(gold_answer))
    boxed = format_reward if _last_boxed(completion) is not None else 0.0
    return float(correct) + boxed


# ----------------------------------------------------------------------------------------------
# GRPO advantages and the two policy losses
# ----------------------------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean(r_group)) / (std(r_group) + ε) for consecutive groups of `group_size`.
    A group whose rewards are all equal carries no signal and gets A = 0 (never NaN)."""
    grouped = rewards.view(-1, group_size).float()
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)  # Bessel-corrected, as in DeepSeekMath/TRL; 0 when all equal
    return ((grouped - mean) / (std + eps)).view(-1)


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sequence-level advantages [B] broadcast to every token [B, T] (GRPO's outcome supervision)."""
    return advantages[:, None].expand_as(like) if advantages.dim() == 1 else advantages


def _ratio_inputs(newlogprobs, behavior_logprobs, advantages, mask, num_tokens):
    """ρ_t = π_θ(y_t|·) / μ(y_t|·) on valid tokens and 1 on padding (whatever sits there, so an
    overflowing exp can never turn 0·inf into NaN), per-token advantages, float mask, denominator."""
    valid = mask.bool()
    ratio = torch.exp(torch.where(valid, newlogprobs - behavior_logprobs, torch.zeros_like(newlogprobs)))
    num_tokens = valid.sum().clamp(min=1) if num_tokens is None else num_tokens
    return ratio, _per_token(advantages, newlogprobs), mask.float(), num_tokens


def clip_token_loss(newlogprobs, behavior_logprobs, advantages, mask, clip_coef, num_tokens=None):
    """GRPO's PPO-clip surrogate, token-mean over valid tokens. Returns (loss, clip_fraction).
    `num_tokens` is the denominator (the minibatch's valid tokens when micro-batching)."""
    ratio, adv, mask, num_tokens = _ratio_inputs(newlogprobs, behavior_logprobs, advantages, mask, num_tokens)
    # L = -min(ρ A, clip(ρ, 1-ε, 1+ε) A)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * adv)
    loss = -(surrogate * mask).sum() / num_tokens
    clipped = ((ratio - 1).abs() > clip_coef).float()
    clip_fraction = (clipped * mask).sum() / mask.sum().clamp(min=1)
    return loss, clip_fraction.detach()


def vaco_token_loss(newlogprobs, behavior_logprobs, advantages, mask, tv_threshold, num_tokens=None, tv=None):
    """VACO's filtered surrogate, token-mean over valid tokens. Returns (loss, tv, filtered_fraction).

    tv = ½ · mean over valid tokens of |ρ - 1|, a sample estimate of TV(μ, π_θ) (no gradient).
    If tv > δ, a token is filtered when A·sign(ρ - 1) > 0: its update would push π further from μ.
    A filtered token contributes sg(ρA): no gradient, but it stays in the denominator.
    No ratio clipping. `num_tokens` and `tv` may be given for the whole minibatch when micro-batching,
    so that the gradient equals the one-batch gradient."""
    ratio, adv, mask, num_tokens = _ratio_inputs(newlogprobs, behavior_logprobs, advantages, mask, num_tokens)
    if tv is None:
        tv = 0.5 * ((ratio.detach() - 1).abs() * mask).sum() / mask.sum().clamp(min=1)
    tv = torch.as_tensor(tv, dtype=ratio.dtype, device=ratio.device)
    filtered = (adv * torch.sign(ratio.detach() - 1) > 0) & (mask > 0) & (tv > tv_threshold)
    surrogate = torch.where(filtered, (ratio * adv).detach(), ratio * adv)
    loss = -(surrogate * mask).sum() / num_tokens
    filtered_fraction = filtered.float().sum() / mask.sum().clamp(min=1)
    return loss, tv.detach(), filtered_fraction.detach()


def k3_kl(newlogprobs, ref_logprobs):
    """Per-token k3 estimate of KL(π_θ || π_ref): exp(ref - new) - (ref - new) - 1 ≥ 0."""
    diff = ref_logprobs - newlogprobs
    return torch.exp(diff) - diff - 1


# ----------------------------------------------------------------------------------------------
# Sampling and log-probs
# ----------------------------------------------------------------------------------------------
def build_prompt(tokenizer, question: str, instruction: str) -> str:
    """The chat-formatted prompt (plain text when the tokenizer has no chat template)."""
    content = f"{question}\n{instruction}" if instruction else question
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    return f"Question: {content}\nAnswer:"


def completion_mask_from(completions: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """1 for completion tokens up to and including the first end-of-sequence token, 0 after it
    (generate pads finished sequences; those pads are not actions of the policy)."""
    is_eos = torch.isin(completions, eos_ids)
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()
    return (eos_before == 0).long()


@torch.no_grad()
def sample_completions(model, tokenizer, prompts, max_new_tokens, temperature, do_sample, eos_ids, autocast):
    """Generate one completion per prompt. Returns input_ids [B, P+C] (prompt left-padded),
    attention_mask [B, P+C] and completion_mask [B, C]. The sampler draws from softmax(logits / T)
    exactly: no top-k, top-p or repetition penalty (the model's own generation defaults were
    cleared at load), so μ is the distribution `completion_logprobs` computes."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    model.eval()
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
    with autocast:
        sequences = model.generate(
            **enc, max_new_tokens=max_new_tokens, eos_token_id=eos_ids.tolist(),
            pad_token_id=tokenizer.pad_token_id, **sampling,
        )
    completions = sequences[:, enc["input_ids"].shape[1] :]
    completion_mask = completion_mask_from(completions, eos_ids)
    attention_mask = torch.cat([enc["attention_mask"], completion_mask], dim=1)
    return sequences, attention_mask, completion_mask


def completion_logprobs(model, input_ids, attention_mask, completion_len, temperature, with_entropy=False):
    """log π(y_t | x, y_<t) at temperature T for the last `completion_len` tokens of each row:
        log π_T(y_t) = z_{y_t}/T - logsumexp(z/T)
    and optionally the entropy of π_T at each of those positions (no gradient; for logging)."""
    # positions count real tokens only, as generate does for left-padded prompts
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    # only the logits that predict completion tokens are needed: logits at t predict token t+1
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        logits_to_keep=completion_len + 1, use_cache=False,
    ).logits[:, :-1].float() / temperature
    targets = input_ids[:, -completion_len:]
    # gather minus logsumexp avoids materialising a full [B, C, vocab] log-softmax tensor
    logprobs = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            z = logits.detach()
            entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logprobs, entropy


def _chunks(indices: torch.Tensor, size: int):
    return [indices[i : i + size] for i in range(0, len(indices), size)]


# ----------------------------------------------------------------------------------------------
# One GRPO step: generate, score, then N optimiser steps (the forward lag)
# ----------------------------------------------------------------------------------------------
def grpo_step(model, optimizer, tokenizer, prompts, golds, reward_fn: Callable[[str, str], float], args: Args,
              eos_ids, autocast=nullcontext(), ref_model=None, generator=None):
    """Runs one training step on `prompts` (each repeated `group_size` times) and returns statistics."""
    G, N = args.group_size, args.num_minibatches
    stats = {}

    # 1. Sample G completions per prompt with the current policy μ = π_θ0
    t0 = time.time()
    group_prompts = [p for p in prompts for _ in range(G)]  # prompt-major: groups are consecutive rows
    input_ids, attention_mask, mask = sample_completions(
        model, tokenizer, group_prompts, args.max_new_tokens, args.temperature, True, eos_ids, autocast
    )
    C = mask.shape[1]
    texts = tokenizer.batch_decode(input_ids[:, -C:] * mask + tokenizer.pad_token_id * (1 - mask), skip_special_tokens=True)
    stats["gen_time"] = time.time() - t0
    stats["gen_tokens"] = int(mask.sum())
    stats["completions"] = texts

    # 2. Verifiable rewards and group-relative advantages
    rewards = torch.tensor([reward_fn(text, gold) for text, gold in zip(texts, (g for g in golds for _ in range(G)))])
    advantages = group_advantages(rewards, G, args.adv_eps).to(model.device)
    stats["reward_mean"] = rewards.mean().item()
    stats["reward_std"] = rewards.std().item()
    stats["zero_std_group_fraction"] = (rewards.view(-1, G).std(dim=1) == 0).float().mean().item()
    stats["completion_length"] = mask.sum(dim=1).float().mean().item()
    stats["truncated_fraction"] = (~torch.isin(input_ids[:, -C:], eos_ids).any(dim=1)).float().mean().item()

    # 3. Split into N minibatches (random, so each minibatch mixes groups), and micro-batches
    t0 = time.time()
    B = len(group_prompts)
    perm = torch.randperm(B, generator=generator).to(model.device)
    minibatches = perm.view(N, B // N)
    mbs = args.micro_batch_size or B // N
    # μ's log-probs, computed with θ0 by the same function, on the same micro-batches as training,
    # so that at zero lag (minibatch 0) ρ = 1 exactly, and every ρ ≠ 1 later is forward lag.
    behavior_logprobs = torch.zeros(B, C, device=model.device)
    ref_logprobs = torch.zeros(B, C, device=model.device) if ref_model is not None else None
    with torch.no_grad(), autocast:
        for idx in minibatches:
            for micro in _chunks(idx, mbs):
                behavior_logprobs[micro] = completion_logprobs(model, input_ids[micro], attention_mask[micro], C, args.temperature)[0]
                if ref_model is not None:
                    ref_logprobs[micro] = completion_logprobs(ref_model, input_ids[micro], attention_mask[micro], C, args.temperature)[0]

    # 4. One optimiser step per minibatch: minibatch k sees π_θk, k steps newer than μ
    model.train()
    per_mb = {key: [] for key in ("loss", "tv", "filtered_fraction", "clip_fraction", "ratio_mean", "ratio_min",
                                  "ratio_max", "entropy", "kl", "grad_norm")}
    for idx in minibatches:
        micros = _chunks(idx, mbs)
        num_tokens = mask[idx].sum().clamp(min=1)  # token-mean over the whole minibatch
        tv_minibatch = None
        if args.loss == "vaco" and len(micros) > 1:
            # the filter's switch (tv > δ) is a property of the whole minibatch: measure it first
            with torch.no_grad(), autocast:
                abs_dev = 0.0
                for m in micros:
                    newlogprobs = completion_logprobs(model, input_ids[m], attention_mask[m], C, args.temperature)[0]
                    ratio = _ratio_inputs(newlogprobs, behavior_logprobs[m], advantages[m], mask[m], None)[0]
                    abs_dev = abs_dev + ((ratio - 1).abs() * mask[m]).sum()
            tv_minibatch = 0.5 * abs_dev / num_tokens
        optimizer.zero_grad(set_to_none=True)
        acc = {key: 0.0 for key in per_mb}
        acc["ratio_min"], acc["ratio_max"] = float("inf"), float("-inf")
        for micro in micros:
            m_mask = mask[micro]
            with autocast:
                newlogprobs, entropy = completion_logprobs(
                    model, input_ids[micro], attention_mask[micro], C, args.temperature, with_entropy=True
                )
            beh = behavior_logprobs[micro]
            if args.loss == "vaco":
                loss, tv, filtered = vaco_token_loss(
                    newlogprobs, beh, advantages[micro], m_mask, args.tv_threshold, num_tokens, tv_minibatch
                )
                _, clip_fraction = clip_token_loss(newlogprobs.detach(), beh, advantages[micro], m_mask, args.clip_coef)
            else:
                loss, clip_fraction = clip_token_loss(newlogprobs, beh, advantages[micro], m_mask, args.clip_coef, num_tokens)
                _, tv, filtered = vaco_token_loss(newlogprobs.detach(), beh, advantages[micro], m_mask, args.tv_threshold)
            if ref_model is not None:
                # padding gets ref = new: k3 = 0 there, and no overflow from whatever sits in it
                ref = torch.where(m_mask.bool(), ref_logprobs[micro], newlogprobs.detach())
                kl = (k3_kl(newlogprobs, ref) * m_mask).sum() / num_tokens
                loss = loss + args.beta * kl
                acc["kl"] += kl.item()
            loss.backward()  # gradients accumulate over micro-batches; the sum is the minibatch gradient
            # statistics, weighted by this micro-batch's share of the minibatch's valid tokens
            share = (m_mask.sum() / num_tokens).item()
            ratio = torch.exp(newlogprobs.detach() - beh)[m_mask.bool()]
            acc["loss"] += loss.item()
            acc["filtered_fraction"] += filtered.item() * share
            acc["clip_fraction"] += clip_fraction.item() * share
            acc["entropy"] += ((entropy * m_mask).sum() / num_tokens).item()
            acc["ratio_mean"] += (ratio.sum() / num_tokens).item()
            if ratio.numel():
                acc["ratio_min"] = min(acc["ratio_min"], ratio.min().item())
                acc["ratio_max"] = max(acc["ratio_max"], ratio.max().item())
            acc["tv"] += tv.item() * share  # token-weighted mean of micro-batch TVs = the minibatch TV
        acc["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm).item()
        optimizer.step()
        for key in per_mb:
            per_mb[key].append(acc[key])
    stats["train_time"] = time.time() - t0
    stats["train_tokens"] = int(attention_mask.sum())
    stats["per_minibatch"] = per_mb
    stats["rewards"] = rewards
    return stats


# ----------------------------------------------------------------------------------------------
# Data, model, evaluation
# ----------------------------------------------------------------------------------------------
def gold_from_answer(answer: str) -> Optional[str]:
    """The gold number of a GSM8k answer text: what follows the last `####`."""
    found = re.findall(r"####\s*([^\n]+)", answer)
    return _clean(found[-1]) if found else None


def load_problems(args: Args):
    """Returns (train, test): lists of (question, gold) pairs; test holds `eval_size` problems."""
    if args.dataset_path is not None:
        if not os.path.isfile(args.dataset_path):
            raise UsageError(f"dataset file not found: {args.dataset_path}")
        problems = []
        with open(args.dataset_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    question, gold = row["question"], gold_from_answer(row["answer"])
                    assert isinstance(question, str) and question.strip() and gold is not None
                except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
                    raise UsageError(
                        f"{args.dataset_path}:{lineno}: malformed line (need JSON with a 'question' and an "
                        f"'answer' ending in '#### N')"
                    ) from None
                problems.append((question, gold))
        if len(problems) <= args.eval_size:
            raise UsageError(
                f"{args.dataset_path} has {len(problems)} problems: need more than --eval-size {args.eval_size} "
                "(the held-out evaluation problems) to train on"
            )
        random.Random(args.seed).shuffle(problems)  # the held-out split is fixed by the seed
        return problems[args.eval_size :], problems[: args.eval_size]
    try:
        import datasets

        ds = datasets.load_dataset(args.dataset_id, args.dataset_config)
    except Exception as e:  # offline, unknown name, ...: one line, not a traceback
        raise UsageError(f"cannot load dataset '{args.dataset_id}' ({args.dataset_config}): {str(e).splitlines()[0]}") from None
    train = [(r["question"], gold_from_answer(r["answer"])) for r in ds["train"]]
    test = [(r["question"], gold_from_answer(r["answer"])) for r in ds["test"]][: args.eval_size]
    return train, test


def load_model(args: Args, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_id)
        model = AutoModelForCausalLM.from_pretrained(args.model_id, dtype=dtype).to(device)
    except Exception as e:  # unknown path or hub id, no network, not a causal LM, ...
        raise UsageError(f"cannot load model '{args.model_id}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    # every token that may end a completion: the tokenizer's eos and the model's (chat models have several)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    if not eos:
        raise UsageError(f"model '{args.model_id}' defines no end-of-sequence token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation appends to the right of every prompt
    # Clear the model's sampling defaults (Qwen ships top_k=20, top_p=0.8, repetition_penalty=1.05):
    # the behaviour policy must be exactly softmax(logits / T), the distribution the loss scores.
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer, torch.tensor(sorted(eos), device=device)


@torch.no_grad()
def evaluate(model, tokenizer, problems, args: Args, eos_ids, autocast):
    """Greedy accuracy on held-out problems."""
    correct = []
    for i in range(0, len(problems), args.eval_batch_size):
        batch = problems[i : i + args.eval_batch_size]
        prompts = [build_prompt(tokenizer, q, args.instruction) for q, _ in batch]
        input_ids, _, mask = sample_completions(model, tokenizer, prompts, args.max_new_tokens, 1.0, False, eos_ids, autocast)
        C = mask.shape[1]
        texts = tokenizer.batch_decode(input_ids[:, -C:] * mask + tokenizer.pad_token_id * (1 - mask), skip_special_tokens=True)
        correct += [gsm8k_reward(text, gold) for text, (_, gold) in zip(texts, batch)]
    return float(np.mean(correct)) if correct else float("nan")


def validate(args: Args):
    """Checks that need no model or data; each failure is one clear line."""
    checks = [
        (args.group_size >= 2, f"--group-size must be at least 2 (got {args.group_size}): GRPO's baseline is the group mean"),
        (args.num_prompts >= 1, f"--num-prompts must be at least 1 (got {args.num_prompts})"),
        (args.num_minibatches >= 1, f"--num-minibatches must be at least 1 (got {args.num_minibatches})"),
        ((args.num_prompts * args.group_size) % max(args.num_minibatches, 1) == 0,
         f"the batch (--num-prompts {args.num_prompts} x --group-size {args.group_size} = "
         f"{args.num_prompts * args.group_size} completions) is not divisible by --num-minibatches {args.num_minibatches}"),
        (args.num_steps >= 1, f"--num-steps must be at least 1 (got {args.num_steps})"),
        (args.micro_batch_size >= 0, f"--micro-batch-size must be >= 0 (got {args.micro_batch_size})"),
        (args.temperature > 0, f"--temperature must be > 0 (got {args.temperature})"),
        (args.max_new_tokens >= 1, f"--max-new-tokens must be at least 1 (got {args.max_new_tokens})"),
        (args.learning_rate > 0, f"--learning-rate must be > 0 (got {args.learning_rate})"),
        (args.clip_coef > 0, f"--clip-coef must be > 0 (got {args.clip_coef})"),
        (args.tv_threshold > 0, f"--tv-threshold must be > 0 (got {args.tv_threshold})"),
        (args.beta >= 0, f"--beta must be >= 0 (got {args.beta})"),
        (args.eval_size >= 0 and args.eval_every >= 0, "--eval-size and --eval-every must be >= 0"),
        (args.eval_batch_size >= 1, f"--eval-batch-size must be at least 1 (got {args.eval_batch_size})"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    if args.save_model and os.path.exists(args.save_path):
        raise UsageError(f"--save-path {args.save_path} already exists: choose another one (nothing is overwritten)")


def _hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def train(args: Args):
    run_name = f"gsm8k__{args.exp_name}__{args.loss}_N{args.num_minibatches}__{args.seed}__{int(time.time())}"
    if args.save_path is None:
        args.save_path = f"runs/{run_name}/model"
    validate(args)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # fp32 master weights (AdamW updates of ~1e-6 vanish in bf16 weights); bf16 compute on GPUs that have it
    use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()

    train_problems, test_problems = load_problems(args)
    model, tokenizer, eos_ids = load_model(args, device, torch.float32)
    if args.gradient_checkpointing:  # renamed in recent transformers 5.x releases; both work
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref_model = None
    if args.beta > 0:  # a frozen copy of the initial policy for the KL penalty
        import copy

        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    reward_fn = partial(gsm8k_reward, format_reward=args.format_reward)

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=vars(args), name=run_name, save_code=True)
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n%s" % "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    print(f"run {run_name}: {len(train_problems)} training problems, {len(test_problems)} held out, device {device}"
          f"{' (bf16 autocast)' if use_bf16 else ''}", flush=True)

    def run_eval(step):
        if not test_problems:
            return float("nan")
        t0 = time.time()
        acc = evaluate(model, tokenizer, test_problems, args, eos_ids, autocast)
        writer.add_scalar("eval/accuracy", acc, step)
        print(f"eval step {step}: greedy accuracy {acc:.4f} on {len(test_problems)} held-out problems ({time.time() - t0:.1f}s)", flush=True)
        return acc

    accuracy_before = run_eval(0)
    accuracy = accuracy_before
    generator = torch.Generator().manual_seed(args.seed)
    order, cursor = [], 0  # walk the training problems in shuffled epochs
    start_time, completions_done = time.time(), 0
    for step in range(1, args.num_steps + 1):
        batch = []
        while len(batch) < args.num_prompts:
            if cursor == len(order):
                order, cursor = np.random.permutation(len(train_problems)).tolist(), 0
            batch.append(train_problems[order[cursor]])
            cursor += 1
        prompts = [build_prompt(tokenizer, q, args.instruction) for q, _ in batch]
        stats = grpo_step(model, optimizer, tokenizer, prompts, [g for _, g in batch], reward_fn, args,
                          eos_ids, autocast, ref_model, generator)
        completions_done += len(stats["completions"])
        golds = [g for _, g in batch for _ in range(args.group_size)]
        train_accuracy = float(np.mean([gsm8k_reward(t, g) for t, g in zip(stats["completions"], golds)]))

        mb = stats["per_minibatch"]
        writer.add_scalar("charts/reward_mean", stats["reward_mean"], step)
        writer.add_scalar("charts/reward_std", stats["reward_std"], step)
        writer.add_scalar("charts/train_accuracy", train_accuracy, step)
        writer.add_scalar("charts/completion_length", stats["completion_length"], step)
        writer.add_scalar("charts/truncated_fraction", stats["truncated_fraction"], step)
        writer.add_scalar("charts/zero_std_group_fraction", stats["zero_std_group_fraction"], step)
        for key in ("loss", "tv", "filtered_fraction", "clip_fraction", "ratio_mean", "entropy", "grad_norm"):
            writer.add_scalar(f"losses/{key}", float(np.mean(mb[key])), step)
        writer.add_scalar("losses/ratio_min", min(mb["ratio_min"]), step)
        writer.add_scalar("losses/ratio_max", max(mb["ratio_max"]), step)
        if ref_model is not None:
            writer.add_scalar("losses/kl", float(np.mean(mb["kl"])), step)
        for k in range(args.num_minibatches):  # how the lag grows with the minibatch index
            writer.add_scalar(f"lag/tv_minibatch_{k}", mb["tv"][k], step)
            writer.add_scalar(f"lag/filtered_fraction_minibatch_{k}", mb["filtered_fraction"][k], step)
        writer.add_scalar("perf/gen_tokens_per_s", stats["gen_tokens"] / stats["gen_time"], step)
        writer.add_scalar("perf/train_tokens_per_s", stats["train_tokens"] / stats["train_time"], step)
        elapsed = time.time() - start_time
        sps = completions_done / elapsed  # completions (episodes) per second, evaluation time included
        writer.add_scalar("charts/SPS", sps, step)

        if args.eval_every and step % args.eval_every == 0 and step < args.num_steps:
            accuracy = run_eval(step)
        eta = elapsed / step * (args.num_steps - step)
        print(f"step {step}/{args.num_steps} | reward {stats['reward_mean']:.3f} | train acc {train_accuracy:.3f} | "
              f"eval acc {accuracy:.3f} | tv {np.mean(mb['tv']):.4f} | filtered {np.mean(mb['filtered_fraction']):.3f} | "
              f"clipped {np.mean(mb['clip_fraction']):.3f} | len {stats['completion_length']:.0f} | "
              f"gen {stats['gen_tokens'] / stats['gen_time']:.0f} tok/s | train {stats['train_tokens'] / stats['train_time']:.0f} tok/s | "
              f"SPS: {sps:.2f} | left {_hms(eta)}", flush=True)

    accuracy_after = run_eval(args.num_steps)
    print(f"accuracy before {accuracy_before:.4f} after {accuracy_after:.4f} | SPS: {completions_done / (time.time() - start_time):.2f}", flush=True)
    if args.save_model:
        path = args.save_path
        while os.path.exists(path):  # appeared during training: never overwrite, save beside it
            path = f"{path}-new"
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        print(f"model saved to {path}", flush=True)
    writer.close()
    if args.track:
        wandb.finish()
    return {"accuracy_before": accuracy_before, "accuracy_after": accuracy_after, "run_name": run_name}


def main(args: Optional[Args] = None):
    args = tyro.cli(Args) if args is None else args
    try:
        return train(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
