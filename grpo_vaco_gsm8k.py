# GRPO for an LLM on GSM8k under forward and backward lag, with six policy losses side by side.
# Reference: "Align and Filter: Improving Performance in Asynchronous On-Policy RL" (arXiv 2603.01365).
# Docs: docs/grpo_vaco_gsm8k.md
#
# One training step:
#   1. take the oldest batch the inference engine has generated: `num_prompts` problems, G = `group_size`
#      completions each, sampled at temperature T by the behaviour policy μ, the learner's policy of S =
#      `staleness` steps ago ("backward lag"), with μ's per-token log-probs and its verifiable 0/1 rewards
#      turned into group-relative advantages (GRPO);
#   2. split it into N = `num_minibatches` minibatches and take ONE optimiser step on each: minibatch k is
#      trained by π_θk, k optimiser steps newer than π_prox, the policy at the step's start ("forward lag").
# The losses differ in how they cope with the lag: PPO-clip clips ρ = π_θ/μ; VACO, while the minibatch's
# total variation to μ exceeds δ, filters the tokens whose update would push π further from μ; DPPO masks
# each token whose own probability moved more than its δ the way its advantage pushes; decoupled PPO and
# TIS clip π_θ/π_prox and weight each token by π_prox/μ (TIS truncates the weight); M2PO masks the tokens of
# largest (log ρ)² until the second moment of the others is under a bound.
import json
import math
import os
import random
import re
import sys
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from itertools import chain, count
from typing import Callable, Literal, Optional

import numpy as np
import torch
import tyro
from torch.utils.checkpoint import checkpoint
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
    save_every: int = 0
    """also save the model and tokenizer every this many steps to `runs/<run_name>/checkpoint-<step>` (0 = never)"""
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
    `eval_size` problems are held out from it as the test split, the same ones for every seed"""
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."
    """appended to each question in the user message of the chat template"""

    # GRPO
    loss: Literal["clip", "vaco", "dppo-tv", "decoupled", "tis", "m2po"] = "vaco"
    """the policy loss: `clip` (GRPO's PPO-clip), `vaco` (VACO's TV filter with its minibatch switch), `dppo-tv`
    (DPPO's binary-TV mask), `decoupled` (decoupled PPO, as AReaL's before 2026-03), `tis` (decoupled PPO with
    truncated importance weights, as slime's `--use-tis`) or `m2po` (M2PO's second-moment mask)"""
    staleness: int = 0
    """S: the batch trained at step t was generated, with its μ log-probs, by the policy of step t - S
    (backward lag; the first S + 1 steps train on batches of the initial policy, ages 0 … S)"""
    num_steps: int = 200
    """number of training steps (one generation batch each)"""
    num_prompts: int = 16
    """problems sampled per step"""
    group_size: int = 8
    """completions sampled per problem (G); advantages are relative to the group"""
    num_minibatches: int = 8
    """N: optimiser steps per generation batch. Minibatch k is trained k steps after the step's start (forward lag)"""
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
    mask_truncated_completions: bool = False
    """if toggled, completions that hit `--max-new-tokens` without an end token get no gradient
    (they still count in their group's advantages)"""
    scale_rewards: Literal["group", "none"] = "group"
    """`group`: A = (r - group mean) / (group std + ε) (GRPO); `none`: A = r - group mean (Dr. GRPO)"""
    adv_eps: float = 1e-4
    """ε in the group advantage (r - mean) / (std + ε)"""
    clip_coef: float = 0.2
    """`clip`: the surrogate clipping coefficient ε (the ratio is clipped to [1 - ε, 1 + ε_high]); 0 keeps the
    gradient only of tokens whose update moves π back towards μ (VACO's token rule with its filter always on)"""
    epsilon_high: Optional[float] = None
    """`clip`: the upper clipping coefficient ε_high (clip-higher; DAPO uses 0.28); default: `--clip-coef`"""
    tv_threshold: float = 0.005
    """`vaco`: δ, the minibatch's total variation to μ above which its filter is on. Not from the paper: the
    median TV of the stale minibatches measured at lr 1e-6 and N = 8 (docs: the rule, and how to apply it to
    your run from its `lag/tv_minibatch_k` curves)"""
    dppo_delta: float = 0.15
    """`dppo-tv`: δ of DPPO's binary-TV mask, on each token's probability |π_θ(y_t) - μ(y_t)| (0.15, the DPPO
    authors' TV threshold in their verl example `run_qwen30b_dppo.sh`, verl v0.7.1, and TRL v1.0-1.8's `DPPOConfig`)"""
    tis_cap: float = 2.0
    """`tis`: C, the cap of the importance weight min(π_prox/μ, C) (2: slime's `--tis-clip`, verl's rollout IS)"""
    m2po_bound: float = 0.04
    """`m2po`: τ, the bound on the minibatch's mean (log ρ)² that M2PO's mask enforces (0.04, as M2PO's scripts)"""
    beta: float = 0.0
    """coefficient of the k3 KL penalty to the initial model (0 = off; no reference model is kept)"""
    answer_extraction: Literal["strict", "flexible"] = "strict"
    """`strict`: only a marked final answer counts (the last complete \\boxed{}, else a `#### N` line);
    `flexible`: that, else the last number in the completion"""
    format_reward: float = 0.0
    """extra reward for a completion that contains a \\boxed{} answer (0 = off)"""
    gradient_checkpointing: bool = True
    """recompute activations in the backward pass to save memory (slower; matters on GPU for 0.5B models)"""

    # Evaluation
    eval_every: int = 20
    """evaluate every this many steps (0 = only before and after training)"""
    eval_before: bool = True
    """evaluate before training (step 0). Greedy evaluation is deterministic: runs that start from the same
    model on the same test problems (any seed) share this figure, so a study may compute it once"""
    eval_size: int = 200
    """number of test problems for the periodic greedy evaluation (0 = none)"""
    final_eval: bool = True
    """after training, also evaluate on the whole test split (GSM8k: 1,319 problems), if larger than `eval_size`"""
    test_path: Optional[str] = None
    """a local JSONL test split in GSM8k's format (e.g. GSM8k's `test.jsonl`); then nothing is held out of the training data"""
    eval_samples: int = 0
    """n: after training, also sample n completions of each final test problem at T for mean@n and pass@k (0 = off)"""
    pass_k: int = 1
    """k of the unbiased pass@k (k ≤ `eval_samples`)"""
    eval_batch_size: int = 64
    """prompts per greedy generation call during evaluation"""
    num_logged_samples: int = 4
    """completions (with their reward) logged as TensorBoard text at each evaluation"""


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2, no traceback."""


# ----------------------------------------------------------------------------------------------
# GRPO advantages and the six policy losses
# ----------------------------------------------------------------------------------------------
# --8<-- [start:group_advantages]
def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group", eps: float = 1e-4):
    """GRPO's advantages for consecutive groups of `group_size` completions of the same prompt:
        A_i = (r_i - mean_group(r)) / (std_group(r) + ε)   `group` (DeepSeekMath, TRL's default)
        A_i =  r_i - mean_group(r)                         `none`  (Dr. GRPO)
    A group whose rewards are all equal carries no signal and gets A = 0 (never NaN)."""
    grouped = rewards.view(-1, group_size).float()
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + eps)  # Bessel-corrected, as in TRL
    return advantages.view(-1)
# --8<-- [end:group_advantages]


# --8<-- [start:clip_loss]
def clip_token_loss(newlogprobs, mu_logprobs, advantages, mask, clip_coef, epsilon_high=None, num_tokens=None):
    """GRPO's PPO-clip surrogate, token mean over the valid tokens (mask = 1):
        ℓ_t = -min(ρ_t A, clip(ρ_t, 1 - ε, 1 + ε_high) A),   ρ_t = π_θ(y_t|·) / μ(y_t|·)
    Returns (loss, clipped): `clipped` marks the tokens whose gradient the clip sets to zero,
    A > 0 with ρ > 1 + ε_high and A < 0 with ρ < 1 - ε.
    `num_tokens` is the denominator: the whole minibatch's valid tokens when this is one micro-batch of it."""
    valid = mask.bool()
    # ρ = 1 on padding, whatever the forward pass left there (an overflowing exp cannot reach the loss)
    ratio = torch.exp(torch.where(valid, newlogprobs - mu_logprobs, 0.0))
    adv = advantages[:, None]  # one advantage per completion, shared by all of its tokens
    eps_high = clip_coef if epsilon_high is None else epsilon_high
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_coef, 1 + eps_high) * adv)
    loss = -(surrogate * mask).sum() / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    clipped = valid & (((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - clip_coef)))
    return loss, clipped.detach()
# --8<-- [end:clip_loss]


# --8<-- [start:vaco_loss]
def vaco_token_loss(newlogprobs, mu_logprobs, advantages, mask, tv_threshold, num_tokens=None, tv=None):
    """VACO's filtered surrogate, token mean over the valid tokens. Returns (loss, tv, filtered).
        tv = ½ Σ_t m_t |ρ_t - 1| / Σ_t m_t                a sample estimate of TV(μ, π_θ), no gradient
        filtered_t = [tv > δ] · [A · sign(ρ_t - 1) > 0]    the update would move π further from μ
        ℓ_t = -sg(ρ_t A) if filtered_t else -ρ_t A         sg = stop-gradient; no ratio clipping
    A filtered token has no gradient but stays in the denominator. When this call sees one micro-batch
    of a minibatch, pass the minibatch's `num_tokens` and `tv`: the switch belongs to the whole minibatch."""
    valid = mask.bool()
    ratio = torch.exp(torch.where(valid, newlogprobs - mu_logprobs, 0.0))  # 1 on padding
    adv = advantages[:, None]
    if tv is None:
        tv = 0.5 * (ratio.detach() - 1).abs().sum() / valid.sum().clamp(min=1)
    filtered = valid & (adv * torch.sign(ratio.detach() - 1) > 0) & (tv > tv_threshold)
    surrogate = torch.where(filtered, (ratio * adv).detach(), ratio * adv)
    loss = -(surrogate * mask).sum() / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    return loss, torch.as_tensor(tv).detach(), filtered
# --8<-- [end:vaco_loss]


# --8<-- [start:dppo_loss]
def dppo_tv_token_loss(newlogprobs, mu_logprobs, advantages, mask, delta, num_tokens=None):
    """DPPO's binary-TV trust region (arXiv 2602.04879), token mean over the valid tokens. Returns (loss, masked).
        d_t = π_θ(y_t|·) - μ(y_t|·)                        the token's own probability change (not its ratio)
        masked_t = [A > 0 and d_t > δ] or [A < 0 and d_t < -δ]   it moved more than δ the way A pushes it
        ℓ_t = -sg(ρ_t A) if masked_t else -ρ_t A
    No minibatch-level switch: each token is judged alone. A kept token's gradient, -ρ_t A ∇log π_θ, is that of
    verl's `-A · sg(ρ) · log π` form; the value is written as the ratio surrogate, like the other two losses."""
    valid = mask.bool()
    log_ratio = torch.where(valid, newlogprobs - mu_logprobs, 0.0)  # 0 on padding
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]
    moved = torch.where(valid, torch.exp(newlogprobs.detach()) - torch.exp(mu_logprobs), 0.0)  # 0 on padding
    masked = valid & (((adv > 0) & (moved > delta)) | ((adv < 0) & (moved < -delta)))
    surrogate = torch.where(masked, (ratio * adv).detach(), ratio * adv)
    loss = -(surrogate * mask).sum() / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    return loss, masked
# --8<-- [end:dppo_loss]


# --8<-- [start:decoupled_loss]
def decoupled_token_loss(newlogprobs, prox_logprobs, mu_logprobs, advantages, mask, clip_coef, epsilon_high=None,
                         num_tokens=None, weight_cap=None):
    """Decoupled PPO (Hilton et al. 2021; AReaL's `ppo_actor_loss_fn` before 2026-03-03, arXiv 2505.24298): the clip
    is centred on the proximal policy π_prox (the learner at the step's start), μ only weights each token:
        ℓ_t = -w_t · min(r_t A, clip(r_t, 1 - ε, 1 + ε_high) A),   r_t = π_θ/π_prox,   w_t = π_prox/μ (no gradient)
    `weight_cap` C truncates w_t to min(w_t, C) (TIS). Returns (loss, clipped, weight)."""
    valid = mask.bool()
    weight = torch.exp(torch.where(valid, prox_logprobs - mu_logprobs, 0.0))  # 1 on padding
    if weight_cap is not None:
        weight = weight.clamp(max=weight_cap)
    ratio = torch.exp(torch.where(valid, newlogprobs - prox_logprobs, 0.0))
    adv = advantages[:, None]
    eps_high = clip_coef if epsilon_high is None else epsilon_high
    surrogate = weight * torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_coef, 1 + eps_high) * adv)
    loss = -(surrogate * mask).sum() / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    clipped = valid & (((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - clip_coef)))
    return loss, clipped.detach(), weight


def tis_token_loss(newlogprobs, prox_logprobs, mu_logprobs, advantages, mask, clip_coef, cap, epsilon_high=None,
                   num_tokens=None):
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training") as slime's `--use-tis` applies it (no dual clip; verl's token-level rollout IS adds
    one for A < 0): the decoupled loss with its weight truncated at C. Returns (loss, clipped, weight).
        ℓ_t = -min(π_prox/μ, C)_t · min(r_t A, clip(r_t, 1 - ε, 1 + ε_high) A),   r_t = π_θ/π_prox"""
    return decoupled_token_loss(newlogprobs, prox_logprobs, mu_logprobs, advantages, mask, clip_coef, epsilon_high,
                                num_tokens, weight_cap=cap)
# --8<-- [end:decoupled_loss]


# --8<-- [start:m2po_loss]
def m2po_cutoff(sq_log_ratios: torch.Tensor, bound: float) -> float:
    """The smallest (log ρ)² that M2PO masks: the fewest largest values whose removal brings the mean of the
    others under `bound` (inf when the mean already is). Sorted descending, the mean of v[i:] only falls with i."""
    v = sq_log_ratios.flatten().sort(descending=True).values
    rest_mean = v.flip(0).cumsum(0).flip(0) / torch.arange(len(v), 0, -1, device=v.device)  # mean of v[i:]
    k = int((rest_mean >= bound).sum())  # mask v[:k]
    return v[k - 1].item() if k > 0 else math.inf


def m2po_token_loss(newlogprobs, mu_logprobs, advantages, mask, bound, num_tokens=None, cutoff=None):
    """M2PO (Zheng et al. 2025, arXiv 2510.01161): mask the tokens of largest (log ρ_t)², ρ_t = π_θ/μ, until the
    second moment M̂2 = mean (log ρ)² of the others is under τ = `bound`, and take an unclipped policy gradient
    on the rest, token mean over all valid tokens (the paper's 1/Σ|o_i|; AReaL drops masked tokens from it):
        M_t = [(log ρ_t)² < cutoff],   ℓ_t = -M_t ρ_t A.
    Every token tied at the cutoff is masked, and all of them when no token is under τ (AReaL keeps one).
    Pass the minibatch's `cutoff` when this call sees one micro-batch of it. Returns (loss, masked)."""
    valid = mask.bool()
    log_ratio = torch.where(valid, newlogprobs - mu_logprobs, 0.0)
    if cutoff is None:
        cutoff = m2po_cutoff(log_ratio.detach()[valid] ** 2, bound)
    masked = valid & (log_ratio.detach() ** 2 >= cutoff)
    surrogate = torch.where(masked, 0.0, torch.exp(log_ratio) * advantages[:, None])
    loss = -(surrogate * mask).sum() / (valid.sum().clamp(min=1) if num_tokens is None else num_tokens)
    return loss, masked
# --8<-- [end:m2po_loss]


# --8<-- [start:kl]
def k3_kl(newlogprobs, ref_logprobs):
    """Per-token k3 estimate of KL(π_θ ‖ π_ref), as in DeepSeekMath's GRPO and TRL:
        k3 = π_ref/π_θ - log(π_ref/π_θ) - 1 ≥ 0,   and E_{y~π_θ}[k3] = KL(π_θ ‖ π_ref)."""
    log_ratio = ref_logprobs - newlogprobs
    return torch.exp(log_ratio) - log_ratio - 1
# --8<-- [end:kl]


# ----------------------------------------------------------------------------------------------
# Sampling and log-probs
# ----------------------------------------------------------------------------------------------
def build_prompt(tokenizer, question: str, instruction: str) -> str:
    """The chat-formatted prompt (plain text when the tokenizer has no chat template)."""
    content = f"{question}\n{instruction}" if instruction else question
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
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
        sequences = model.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=eos_ids.tolist(),
                                   pad_token_id=tokenizer.pad_token_id, **sampling)
    completions = sequences[:, enc["input_ids"].shape[1] :]
    completion_mask = completion_mask_from(completions, eos_ids)
    attention_mask = torch.cat([enc["attention_mask"], completion_mask], dim=1)
    return sequences, attention_mask, completion_mask


def decode_completions(tokenizer, input_ids, completion_mask) -> list:
    """The text of each completion (its tokens up to the first end token)."""
    C = completion_mask.shape[1]
    ids = input_ids[:, -C:] * completion_mask + tokenizer.pad_token_id * (1 - completion_mask)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _sequence_logprobs(logits, targets, temperature):
    """One sequence's [C, vocab] logits z: log π_T(y_t) = z_{y_t}/T - logsumexp(z/T), and the logsumexp."""
    z = logits.float() / temperature
    logsumexp = torch.logsumexp(z, dim=-1)
    return z.gather(-1, targets[:, None]).squeeze(-1) - logsumexp, logsumexp


def completion_logprobs(model, input_ids, attention_mask, completion_len, temperature, with_entropy=False):
    """log π_T(y_t | x, y_<t) for the last `completion_len` tokens of each row, and optionally the
    entropy of π_T at those positions (no gradient; for logging):
        H = logsumexp(z/T) - Σ_v π_T(v) z_v/T,   from the logsumexp the log-probs already need.
    The [rows, C, vocab] logits are the largest tensors of a step. They are kept in the model's dtype
    and taken to fp32 one sequence at a time; with gradients on, each sequence's fp32 work is
    recomputed in the backward pass (a checkpoint) rather than stored."""
    # positions count real tokens only, as generate does for left-padded prompts
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    # only the logits that predict completion tokens are needed: logits at t predict token t+1
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        logits_to_keep=completion_len + 1, use_cache=False,
    ).logits[:, :-1]
    targets = input_ids[:, -completion_len:]
    logprobs, entropy = [], []
    for z, y in zip(logits, targets):
        if torch.is_grad_enabled():
            lp, logsumexp = checkpoint(_sequence_logprobs, z, y, temperature, use_reentrant=False)
        else:
            lp, logsumexp = _sequence_logprobs(z, y, temperature)
        logprobs.append(lp)
        if with_entropy:
            with torch.no_grad():
                zt, lse = z.float() / temperature, logsumexp.detach()
                entropy.append(lse - (zt - lse[:, None]).exp_().mul_(zt).sum(-1))  # in place: one [C, vocab] temporary
    return torch.stack(logprobs), (torch.stack(entropy) if with_entropy else None)


# ----------------------------------------------------------------------------------------------
# One GRPO step: a batch from the inference engine (backward lag), then N optimiser steps (forward lag)
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def batch_logprobs(model, batch: dict, args: Args, autocast=nullcontext()):
    """log π_T of every completion token of `batch`, without gradients, on the micro-batches of training
    (the same shapes give the same values: with the same weights, ρ = 1 exactly)."""
    input_ids, attention_mask, C = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].shape[1]
    logprobs = torch.zeros(input_ids.shape[0], C, device=input_ids.device)
    for idx in batch["minibatches"]:
        for micro in idx.split(args.micro_batch_size or len(idx)):
            with autocast:
                logprobs[micro] = completion_logprobs(model, input_ids[micro], attention_mask[micro], C, args.temperature)[0]
    return logprobs


def generate_batch(model, tokenizer, prompts, golds, reward_fn: Callable[[str, str], float], args: Args, eos_ids,
                   autocast=nullcontext(), generator=None, version: int = 1) -> dict:
    """The inference engine's part: G completions per prompt from the current policy, which is this batch's
    behaviour policy μ (the policy of step `version`); their rewards and group advantages; the minibatch split;
    and μ's log-probs, stored with the batch: the learner never recomputes them, and keeps no copy of μ."""
    G, N, t0 = args.group_size, args.num_minibatches, time.time()
    group_prompts = [p for p in prompts for _ in range(G)]  # prompt-major: groups are consecutive rows
    input_ids, attention_mask, mask = sample_completions(model, tokenizer, group_prompts, args.max_new_tokens,
                                                         args.temperature, True, eos_ids, autocast)
    texts = decode_completions(tokenizer, input_ids, mask)
    rewards = torch.tensor([reward_fn(text, gold) for text, gold in zip(texts, (g for g in golds for _ in range(G)))])
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": mask, "completions": texts,
             "golds": golds, "truncated": ~torch.isin(input_ids[:, -mask.shape[1]:], eos_ids).any(dim=1),  # no end token
             "rewards": rewards, "advantages": group_advantages(rewards, G, args.scale_rewards, args.adv_eps).to(model.device),
             # random minibatches, so that each mixes groups, fixed here: μ's log-probs use training's micro-batches
             "minibatches": torch.randperm(len(texts), generator=generator).to(model.device).view(N, len(texts) // N),
             "version": version}
    batch["mu_logprobs"] = batch_logprobs(model, batch, args, autocast)
    batch["gen_time"] = time.time() - t0  # sampling and μ's log-probs: the inference engine's time
    return batch


def train_on_batch(model, optimizer, batch: dict, args: Args, step: int, autocast=nullcontext(), ref_model=None) -> dict:
    """N optimiser steps on a batch of age S = step - version. π_prox, the policy at the step's start, is S
    updates newer than μ (backward lag); minibatch k is trained by π_θk, k updates newer than π_prox (forward
    lag). Returns the batch's completions and rewards, and one dict of statistics per minibatch."""
    input_ids, attention_mask, mu_logprobs = batch["input_ids"], batch["attention_mask"], batch["mu_logprobs"]
    mask, T, age = batch["completion_mask"], args.temperature, step - batch["version"]
    C = mask.shape[1]
    # the tokens that get a gradient: all completion tokens, or none of a cut-off completion's
    loss_mask = mask * ~batch["truncated"][:, None] if args.mask_truncated_completions else mask
    t0 = time.time()
    # π_prox: one pass at the step's start (at age 0 the same weights on the same micro-batches give μ's values)
    prox_logprobs = mu_logprobs if age == 0 else batch_logprobs(model, batch, args, autocast)
    ref_logprobs = batch_logprobs(ref_model, batch, args, autocast) if ref_model is not None else None
    # the backward lag, TV(μ, π_prox) = ½ E_μ|π_prox/μ - 1|, estimated on the batch's valid tokens
    valid = loss_mask.bool()
    tv_backward = 0.5 * (torch.exp(torch.where(valid, prox_logprobs - mu_logprobs, 0.0)) - 1).abs().sum() / valid.sum().clamp(min=1)

    model.train()  # for gradient checkpointing; dropout was switched off at load (`disable_dropout`)
    per_minibatch = []
    for idx in batch["minibatches"]:
        micros = idx.split(args.micro_batch_size or len(idx))
        num_tokens = loss_mask[idx].sum().clamp(min=1)  # token mean over the whole minibatch
        switch = None  # VACO's TV and M2PO's cutoff belong to the whole minibatch, measured before its update
        if args.loss in ("vaco", "m2po") and len(micros) > 1:  # with one micro-batch, the loss measures them
            with torch.no_grad(), autocast:
                log_ratios = [(completion_logprobs(model, input_ids[m], attention_mask[m], C, T)[0] - mu_logprobs[m])
                              [loss_mask[m].bool()] for m in micros]
            switch = (0.5 * sum((torch.exp(lr) - 1).abs().sum() for lr in log_ratios) / num_tokens if args.loss == "vaco"
                      else m2po_cutoff(torch.cat(log_ratios) ** 2, args.m2po_bound))
        optimizer.zero_grad(set_to_none=True)
        sums = {}
        for micro in micros:
            with autocast:
                newlogprobs, entropy = completion_logprobs(model, input_ids[micro], attention_mask[micro], C, T, with_entropy=True)
            mu, prox, adv, m_mask = mu_logprobs[micro], prox_logprobs[micro], batch["advantages"][micro], loss_mask[micro]
            if args.loss == "vaco":
                loss, switch, _ = vaco_token_loss(newlogprobs, mu, adv, m_mask, args.tv_threshold, num_tokens, switch)
            elif args.loss == "dppo-tv":
                loss, _ = dppo_tv_token_loss(newlogprobs, mu, adv, m_mask, args.dppo_delta, num_tokens)
            elif args.loss == "decoupled":
                loss, _, _ = decoupled_token_loss(newlogprobs, prox, mu, adv, m_mask, args.clip_coef, args.epsilon_high, num_tokens)
            elif args.loss == "tis":
                loss, _, _ = tis_token_loss(newlogprobs, prox, mu, adv, m_mask, args.clip_coef, args.tis_cap, args.epsilon_high, num_tokens)
            elif args.loss == "m2po":
                loss, _ = m2po_token_loss(newlogprobs, mu, adv, m_mask, args.m2po_bound, num_tokens, switch)
            else:
                loss, _ = clip_token_loss(newlogprobs, mu, adv, m_mask, args.clip_coef, args.epsilon_high, num_tokens)
            kl = None
            if ref_model is not None:
                # padding gets ref = new: k3 = 0 there, and no overflow from whatever sits in it
                ref = torch.where(m_mask.bool(), ref_logprobs[micro], newlogprobs.detach())
                kl = (k3_kl(newlogprobs, ref) * m_mask).sum() / num_tokens
                loss = loss + args.beta * kl
            loss.backward()  # gradients accumulate over micro-batches; the sum is the minibatch gradient
            add_token_sums(sums, newlogprobs.detach(), mu, prox, adv, m_mask, entropy, loss, kl, args)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        per_minibatch.append(minibatch_stats(sums, grad_norm, args, switch if args.loss == "vaco" else None))

    return {**batch, "per_minibatch": per_minibatch, "train_time": time.time() - t0,
            "train_tokens": int(attention_mask.sum()), "age": age, "tv_backward": float(tv_backward)}


# ----------------------------------------------------------------------------------------------
# Statistics for logging (no part of the algorithm)
# ----------------------------------------------------------------------------------------------
def add_token_sums(sums: dict, newlogprobs, mu_logprobs, prox_logprobs, advantages, mask, entropy, loss, kl, args: Args):
    """Adds one micro-batch's sums over its valid tokens to `sums`. Every loss's token mask (or weight) is
    counted under every loss, so that runs of different losses can be compared like for like."""
    valid = mask.bool()
    log_ratio = torch.where(valid, newlogprobs - mu_logprobs, 0.0)
    ratio = torch.exp(log_ratio)
    _, clipped = clip_token_loss(newlogprobs, mu_logprobs, advantages, mask, args.clip_coef, args.epsilon_high)
    _, _, away = vaco_token_loss(newlogprobs, mu_logprobs, advantages, mask, tv_threshold=-1.0)  # switch on
    _, masked = dppo_tv_token_loss(newlogprobs, mu_logprobs, advantages, mask, args.dppo_delta)
    _, clipped_prox, weight = decoupled_token_loss(newlogprobs, prox_logprobs, mu_logprobs, advantages, mask, args.clip_coef, args.epsilon_high)
    adv = advantages[:, None].expand_as(ratio)
    new = {"tokens": valid.sum(), "abs_dev": (ratio - 1).abs().sum(), "away": away.sum(),
           "clip_low": (clipped & (adv < 0)).sum(), "clip_high": (clipped & (adv > 0)).sum(), "masked": masked.sum(),
           "ratio": ratio[valid].sum(), "entropy": entropy[valid].sum(), "loss": loss.detach(),
           "kl": 0.0 if kl is None else kl.detach(), "clip_prox": clipped_prox.sum(), "weight": weight[valid].sum(),
           "fwd_dev": (ratio - weight).abs().sum(),  # |π_θ - π_prox| / μ
           "weight_capped": (valid & (weight > args.tis_cap)).sum()}
    for key, value in new.items():
        sums[key] = sums.get(key, 0.0) + float(value)
    sums.setdefault("sq_log_ratios", []).append(log_ratio[valid] ** 2)  # M2PO's cutoff needs the whole minibatch
    if valid.any():
        sums["ratio_min"] = min(sums.get("ratio_min", math.inf), ratio[valid].min().item())
        sums["ratio_max"] = max(sums.get("ratio_max", -math.inf), ratio[valid].max().item())
        sums["max_abs_log_ratio"] = max(sums.get("max_abs_log_ratio", 0.0), log_ratio[valid].abs().max().item())


def minibatch_stats(sums: dict, grad_norm, args: Args, switch_tv=None) -> dict:
    """Token means over one minibatch. `tv` is the TV VACO's switch used (`switch_tv`), or the same
    estimate from the training passes under the other losses; `filter_on` is 1 when tv > δ, and
    `filtered_fraction` the tokens VACO filters then (under the other losses: would filter);
    `masked_fraction` the tokens DPPO's mask stops (would stop), `m2po_masked_fraction` M2PO's;
    `tv_forward` = ½ E_μ|π_θ/μ - π_prox/μ|, the TV to π_prox that the forward lag adds."""
    n = max(sums["tokens"], 1.0)
    tv = float(switch_tv) if switch_tv is not None else 0.5 * sums["abs_dev"] / n
    filter_on = tv > args.tv_threshold
    sq = torch.cat(sums["sq_log_ratios"])  # (log ρ)² of the minibatch's valid tokens
    return {"loss": sums["loss"], "kl": sums["kl"], "tv": tv, "filter_on": float(filter_on),
            "filtered_fraction": sums["away"] / n if filter_on else 0.0,
            "clip_fraction": (sums["clip_low"] + sums["clip_high"]) / n, "masked_fraction": sums["masked"] / n,
            "clip_fraction_low": sums["clip_low"] / n, "clip_fraction_high": sums["clip_high"] / n,
            "ratio_mean": sums["ratio"] / n, "ratio_min": sums.get("ratio_min", math.nan),
            "ratio_max": sums.get("ratio_max", math.nan), "entropy": sums["entropy"] / n,
            "max_abs_log_ratio": sums.get("max_abs_log_ratio", 0.0),
            "grad_norm": float(grad_norm), "tv_forward": 0.5 * sums["fwd_dev"] / n, "m2": float(sq.sum()) / n,
            "m2po_masked_fraction": float((sq >= m2po_cutoff(sq, args.m2po_bound)).sum()) / n, "clip_fraction_prox": sums["clip_prox"] / n,
            "is_weight_mean": sums["weight"] / n, "tis_capped_fraction": sums["weight_capped"] / n}


def peak_memory_gib() -> float:
    """Peak memory since the start of the process: allocated GPU memory on CUDA, else the peak resident
    memory of the process (weights, optimiser state and the largest step so far, on either device)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def log_step(writer, step: int, stats: dict, train_accuracy: float, args: Args) -> dict:
    """Writes one step's metrics to TensorBoard; returns the few the console line shows."""
    rewards, mask, mb = stats["rewards"], stats["completion_mask"], stats["per_minibatch"]
    mean = lambda key: float(np.mean([m[key] for m in mb]))  # noqa: E731  (mean over the N minibatches)
    scalars = {
        "charts/reward_mean": rewards.mean().item(), "charts/reward_std": rewards.std().item(),
        "charts/train_accuracy": train_accuracy,
        "charts/completion_length": mask.sum(dim=1).float().mean().item(),
        "charts/truncated_fraction": stats["truncated"].float().mean().item(),
        "charts/zero_std_group_fraction": (rewards.view(-1, args.group_size).std(dim=1) == 0).float().mean().item(),
        "losses/ratio_min": min(m["ratio_min"] for m in mb), "losses/ratio_max": max(m["ratio_max"] for m in mb),
        "losses/filter_on_fraction": mean("filter_on"),
        "lag/batch_age": stats["age"], "lag/tv_backward": stats["tv_backward"],
        "perf/gen_tokens_per_s": mask.sum().item() / stats["gen_time"],
        "perf/train_tokens_per_s": stats["train_tokens"] / stats["train_time"],
        "perf/peak_memory_gib": peak_memory_gib(),
    }
    for key in ("loss", "tv", "filtered_fraction", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
                "masked_fraction", "ratio_mean", "entropy", "grad_norm", "tv_forward", "m2", "m2po_masked_fraction",
                "clip_fraction_prox", "is_weight_mean", "tis_capped_fraction") + (("kl",) if args.beta > 0 else ()):
        scalars[f"losses/{key}"] = mean(key)
    for k, m in enumerate(mb):  # how the lag grows with the minibatch index k, and when the filter acts
        for key in ("tv", "tv_forward", "filter_on", "filtered_fraction", "clip_fraction", "masked_fraction",
                    "m2po_masked_fraction", "max_abs_log_ratio"):
            scalars[f"lag/{key}_minibatch_{k}"] = m[key]
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    return scalars


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
        if depth == 0:  # an unclosed \boxed{ (a cut-off completion) is no final answer
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


def extract_answer(text: str, mode: str = "strict") -> Optional[str]:
    """The final answer of a completion. `strict`: the last complete \\boxed{...}, else the last
    `#### N` line, else None. `flexible`: the same, else the last number in the text.
    Commas, `$` and a trailing `.` are stripped; the Unicode minus (−7) counts as a minus sign."""
    text = text.replace("\u2212", "-")
    boxed = _last_boxed(text)
    if boxed is not None:
        return _clean(boxed)
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return _clean(hashes[-1])
    numbers = NUMBER_RE.findall(text)
    if mode == "flexible" and numbers:
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


def gsm8k_reward(completion: str, gold_answer: str, mode: str = "strict", format_reward: float = 0.0) -> float:
    """1 if the completion's final answer (`extract_answer(completion, mode)`) equals the gold answer
    numerically, else 0; plus `format_reward` when the completion puts an answer in \\boxed{}.
    `gold_answer` may be a bare number or a GSM8k answer text ending in `#### N`. Malformed
    completions simply score 0."""
    correct = answers_equal(extract_answer(completion, mode), extract_answer(gold_answer, "flexible"))
    boxed = format_reward if _last_boxed(completion) is not None else 0.0
    return float(correct) + boxed


# ----------------------------------------------------------------------------------------------
# Data, model, evaluation
# ----------------------------------------------------------------------------------------------
def gold_from_answer(answer: str) -> Optional[str]:
    """The gold number of a GSM8k answer text: what follows the last `####`."""
    found = re.findall(r"####\s*([^\n]+)", answer)
    return _clean(found[-1].replace("\u2212", "-")) if found else None


def read_problems(path: str) -> list:
    """The (question, gold) pairs of a JSONL file in GSM8k's format; a malformed line is a one-line error."""
    if not os.path.isfile(path):
        raise UsageError(f"dataset file not found: {path}")
    problems = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, gold = row["question"], gold_from_answer(row["answer"])
                assert isinstance(question, str) and question.strip() and gold is not None
            except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
                raise UsageError(f"{path}:{lineno}: malformed line (need JSON with a 'question' and an 'answer' "
                                 "ending in '#### N')") from None
            problems.append((question, gold))
    if not problems:
        raise UsageError(f"{path} has no problems")
    return problems


def load_problems(args: Args):
    """Returns (train, test): lists of (question, gold) pairs. `test` is `--test-path`, else the hub's test
    split, else the `eval_size` problems held out from `--dataset-path`."""
    test = read_problems(args.test_path) if args.test_path is not None else None
    if args.dataset_path is not None:
        problems = read_problems(args.dataset_path)
        if test is not None:
            return problems, test
        if len(problems) <= args.eval_size:
            raise UsageError(f"{args.dataset_path} has {len(problems)} problems: need more than --eval-size "
                             f"{args.eval_size} (the held-out evaluation problems) to train on")
        random.Random(0).shuffle(problems)  # the same held-out problems for every seed: seeds vary training only
        return problems[args.eval_size :], problems[: args.eval_size]
    try:
        import datasets

        ds = datasets.load_dataset(args.dataset_id, args.dataset_config)
    except Exception as e:  # offline, unknown name, ...: one line, not a traceback
        raise UsageError(f"cannot load dataset '{args.dataset_id}' ({args.dataset_config}): {str(e).splitlines()[0]}") from None
    train = [(r["question"], gold_from_answer(r["answer"])) for r in ds["train"]]
    return train, test or [(r["question"], gold_from_answer(r["answer"])) for r in ds["test"]]


def disable_dropout(model):
    """Dropout off for good, train mode included (gradient checkpointing runs the model in train mode):
    with dropout, π_θ would be a random function and ρ ≠ 1 even at zero lag."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):  # rates used functionally, e.g. Qwen2's attention_dropout
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def load_model(args: Args, device, dtype):
    """Returns (model, tokenizer, eos_ids, generation_config): the last is the model's own generation
    config, which `save` writes back (the model's is cleared for sampling)."""
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
    disable_dropout(model)
    # Clear the model's sampling defaults (Qwen ships top_k=20, top_p=0.8, repetition_penalty=1.05):
    # the behaviour policy must be exactly softmax(logits / T), the distribution the loss scores.
    generation_config = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos), pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer, torch.tensor(sorted(eos), device=device), generation_config


def save(model, tokenizer, generation_config, path: str) -> str:
    """`save_pretrained` of the model and tokenizer, with the model's original generation config;
    never over an existing path (then beside it). Returns the path written."""
    while os.path.exists(path):
        path = f"{path}-new"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    generation_config.save_pretrained(path)  # replaces the one cleared for sampling
    return path


@torch.no_grad()
def evaluate(model, tokenizer, problems, args: Args, eos_ids, autocast, samples: int = 0):
    """Greedy decoding (deterministic) of every problem, or with `samples` > 0 that many completions of each
    sampled at T. Returns (mean reward, completions, rewards), rows problem by problem."""
    rows = [p for p in problems for _ in range(max(samples, 1))]
    completions, rewards = [], []
    for i in range(0, len(rows), args.eval_batch_size):
        batch = rows[i : i + args.eval_batch_size]
        prompts = [build_prompt(tokenizer, q, args.instruction) for q, _ in batch]
        input_ids, _, mask = sample_completions(model, tokenizer, prompts, args.max_new_tokens, args.temperature, samples > 0, eos_ids, autocast)
        texts = decode_completions(tokenizer, input_ids, mask)
        completions += texts
        rewards += [gsm8k_reward(text, gold, args.answer_extraction) for text, (_, gold) in zip(texts, batch)]
    return (float(np.mean(rewards)) if rewards else float("nan")), completions, rewards


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a problem with c correct completions out of n (Chen et al. 2021, arXiv 2107.03374):
    the chance that k of the n, drawn without replacement, hold at least one correct, 1 - C(n - c, k) / C(n, k)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (got k = {k}, n = {n})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def samples_markdown(problems, completions, rewards, n: int) -> str:
    """The first `n` evaluation completions with their rewards, as Markdown for TensorBoard's text tab."""
    blocks = []
    for (question, gold), text, reward in list(zip(problems, completions, rewards))[:n]:
        quoted = "\n".join("    " + line for line in text.splitlines() or [""])  # a code block keeps the text as is
        blocks.append(f"**{question}** (gold {gold}, reward {reward:g})\n\n{quoted}")
    return "\n\n---\n\n".join(blocks)


# every numeric option: the interval of values it takes ("[" and "]" include their bound, "(" and ")" leave it out,
# so inf and nan are outside every one). group_size: GRPO's baseline is the group mean; staleness: a batch cannot come
# from a later policy; dppo_delta bounds a change of probability; m2po_bound a mean of squares; 0 means: num_threads
# torch's default, micro_batch_size the whole minibatch, clip_coef VACO's token rule, beta and format_reward off.
RANGES = dict(
    seed="[0, 4294967295]", num_threads="[0, inf)", save_every="[0, inf)", staleness="[0, inf)", num_steps="[1, inf)",
    num_prompts="[1, inf)", group_size="[2, inf)", num_minibatches="[1, inf)", micro_batch_size="[0, inf)",
    learning_rate="(0, inf)", weight_decay="[0, inf)", max_grad_norm="(0, inf)", temperature="(0, inf)",
    max_new_tokens="[1, inf)", adv_eps="(0, inf)", clip_coef="[0, inf)", epsilon_high="[0, inf)",
    tv_threshold="[0, inf)", dppo_delta="(0, 1)", tis_cap="(0, inf)", m2po_bound="(0, inf)", beta="[0, inf)",
    format_reward="[0, inf)", eval_every="[0, inf)", eval_size="[0, inf)", eval_samples="[0, inf)",
    pass_k="[1, inf)", eval_batch_size="[1, inf)", num_logged_samples="[0, inf)")


def validate(args: Args):
    """Checks that need no model or data, run before either loads; each failure is one clear line."""
    for name, interval in RANGES.items():
        value, (low, high) = getattr(args, name), map(float, interval[1:-1].split(","))
        if value is not None and not (low < value < high or value == low and interval[0] == "["
                                      or value == high and interval[-1] == "]"):
            raise UsageError(f"--{name.replace('_', '-')} must be in {interval}, got {value}")
    if (args.num_prompts * args.group_size) % args.num_minibatches:
        raise UsageError(f"the batch (--num-prompts {args.num_prompts} x --group-size {args.group_size} = "
                         f"{args.num_prompts * args.group_size} completions) is not divisible by --num-minibatches "
                         f"{args.num_minibatches}")
    if args.pass_k > max(args.eval_samples, 1):
        raise UsageError(f"--pass-k {args.pass_k} needs 1 <= k <= --eval-samples ({args.eval_samples}): "
                         "pass@k draws k of the samples")
    if args.save_model and os.path.exists(args.save_path):
        raise UsageError(f"--save-path {args.save_path} already exists: choose another one (nothing is overwritten)")


def _hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def train(args: Args):
    run_name = f"gsm8k__{args.exp_name}__{args.loss}_N{args.num_minibatches}_S{args.staleness}__{args.seed}__{int(time.time())}"
    if os.path.exists(f"runs/{run_name}"):  # never mix two runs' logs or checkpoints
        raise UsageError(f"runs/{run_name} already exists: wait a second or change --exp-name")
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
    eval_problems = test_problems[: args.eval_size]
    model, tokenizer, eos_ids, generation_config = load_model(args, device, torch.float32)
    if args.gradient_checkpointing:  # transformers 5.0 names it gradient_..., later 5.x activation_... (the old name warns)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()  # both default to use_reentrant=False
    ref_model = None
    if args.beta > 0:  # a frozen copy of the initial policy for the KL penalty
        import copy

        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    reward_fn = partial(gsm8k_reward, mode=args.answer_extraction, format_reward=args.format_reward)

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=vars(args), name=run_name, save_code=True)
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n%s" % "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    print(f"run {run_name}: {len(train_problems)} training problems, {len(test_problems)} test problems, "
          f"device {device}{' (bf16 autocast)' if use_bf16 else ''}", flush=True)

    def run_eval(step, problems, tag="eval/accuracy"):
        if not problems:
            return float("nan")
        t0 = time.time()
        accuracy, completions, rewards = evaluate(model, tokenizer, problems, args, eos_ids, autocast)
        writer.add_scalar(tag, accuracy, step)
        if args.num_logged_samples:
            writer.add_text(tag.replace("accuracy", "samples"), samples_markdown(problems, completions, rewards, args.num_logged_samples), step)
        print(f"eval step {step}: greedy accuracy {accuracy:.4f} on {len(problems)} test problems ({time.time() - t0:.1f}s)", flush=True)
        return accuracy

    accuracy_before = run_eval(0, eval_problems) if args.eval_before else float("nan")
    accuracy = accuracy_before
    generator = torch.Generator().manual_seed(args.seed)
    indices = chain.from_iterable(np.random.permutation(len(train_problems)) for _ in count())  # shuffled epochs
    queue, generated = deque(), 0  # the batches generated and not trained yet
    start_time, completions_done = time.time(), 0
    for step in range(1, args.num_steps + 1):
        # The inference engine runs S batches ahead of the learner, with the weights of the step it generates at:
        # at step 1 it generates S + 1 batches with the initial policy, then one per step (the batch of step t + S).
        while len(queue) <= args.staleness and generated < args.num_steps:
            problems = [train_problems[next(indices)] for _ in range(args.num_prompts)]
            prompts = [build_prompt(tokenizer, q, args.instruction) for q, _ in problems]
            queue.append(generate_batch(model, tokenizer, prompts, [g for _, g in problems], reward_fn, args, eos_ids,
                                        autocast, generator, version=step))
            generated += 1
        stats = train_on_batch(model, optimizer, queue.popleft(), args, step, autocast, ref_model)
        completions_done += len(stats["completions"])
        golds = [g for g in stats["golds"] for _ in range(args.group_size)]
        train_accuracy = float(np.mean([gsm8k_reward(t, g, args.answer_extraction) for t, g in zip(stats["completions"], golds)]))
        shown = log_step(writer, step, stats, train_accuracy, args)
        elapsed = time.time() - start_time
        sps = completions_done / elapsed  # completions (episodes) per second, evaluation time included
        writer.add_scalar("charts/SPS", sps, step)

        if args.eval_every and step % args.eval_every == 0 and step < args.num_steps:
            accuracy = run_eval(step, eval_problems)
        if args.save_every and step % args.save_every == 0:
            save(model, tokenizer, generation_config, f"runs/{run_name}/checkpoint-{step}")
        eta = elapsed / step * (args.num_steps - step)
        print(f"step {step}/{args.num_steps} | reward {shown['charts/reward_mean']:.3f} | train acc {train_accuracy:.3f} | "
              f"eval acc {accuracy:.3f} | age {stats['age']} | tv back {stats['tv_backward']:.4f} | "
              f"tv {shown['losses/tv']:.4f} | filter on {shown['losses/filter_on_fraction']:.2f} | "
              f"filtered {shown['losses/filtered_fraction']:.3f} | clipped {shown['losses/clip_fraction']:.3f} | "
              f"masked {shown['losses/masked_fraction']:.3f} | mem {shown['perf/peak_memory_gib']:.1f} GiB | "
              f"len {shown['charts/completion_length']:.0f} | gen {shown['perf/gen_tokens_per_s']:.0f} tok/s | "
              f"train {shown['perf/train_tokens_per_s']:.0f} tok/s | SPS: {sps:.2f} | left {_hms(eta)}", flush=True)

    accuracy_after = run_eval(args.num_steps, eval_problems)
    print(f"accuracy before {accuracy_before:.4f} after {accuracy_after:.4f} | SPS: {completions_done / (time.time() - start_time):.2f}", flush=True)
    accuracy_full = mean_at_n = pass_k = float("nan")
    final_problems = eval_problems
    if args.final_eval and len(test_problems) > len(eval_problems):
        accuracy_full, final_problems = run_eval(args.num_steps, test_problems, "eval/accuracy_full_test"), test_problems
    if args.eval_samples and final_problems:  # n samples of each problem at T: mean@n and the unbiased pass@k
        n, t0 = args.eval_samples, time.time()
        correct = np.array(evaluate(model, tokenizer, final_problems, args, eos_ids, autocast, n)[2]).reshape(-1, n)
        mean_at_n = float(correct.mean())
        pass_k = float(np.mean([pass_at_k(n, int(c), args.pass_k) for c in correct.sum(axis=1)]))
        writer.add_scalar(f"eval/mean_at_{n}", mean_at_n, args.num_steps)
        writer.add_scalar(f"eval/pass_at_{args.pass_k}", pass_k, args.num_steps)
        print(f"eval step {args.num_steps}: mean@{n} {mean_at_n:.4f}, pass@{args.pass_k} {pass_k:.4f} at T = "
              f"{args.temperature} on {len(final_problems)} test problems ({time.time() - t0:.1f}s)", flush=True)
    if args.save_model:
        print(f"model saved to {save(model, tokenizer, generation_config, args.save_path)}", flush=True)
    writer.close()
    if args.track:
        wandb.finish()
    return {"accuracy_before": accuracy_before, "accuracy_after": accuracy_after, "accuracy_full_test": accuracy_full,
            "mean_at_n": mean_at_n, "pass_at_k": pass_k, "run_name": run_name}


def main(args: Optional[Args] = None):
    args = tyro.cli(Args) if args is None else args
    try:
        return train(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
