"""Tests for grpo_vaco_gsm8k.py. No downloads: a tiny random Qwen2 model and a byte-level BPE
tokenizer are built here, saved to a temporary folder and loaded through the script's own path."""
import copy
import dataclasses
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import grpo_vaco_gsm8k as g  # noqa: E402
from benchmark.common import (is_finished, move_stale, read_json, read_scalars, t_interval, tensorboard_log,  # noqa: E402
                              write_atomic)

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PROBLEMS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nShe earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"),
    ("Betty has 1,200 dollars and spends 250. How much is left?", "1,200 - 250 = 950\n#### 950"),
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 eggs. How many eggs are in 5 boxes?", "6 * 5 = 30\n#### 30"),
    ("Sam reads 10 pages a day for 3 days. How many pages?", "10 * 3 = 30\n#### 30"),
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one thread is as fast, and much faster than two on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 model and a byte-level BPE tokenizer with a ChatML template, on disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tk.train_from_iterator([q + " " + a + " \\boxed{42}" for q, a in PROBLEMS] * 5, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=CHATML)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # a sampling default the script must ignore (Qwen ships top_k=20): μ must be exactly softmax(z / T)
    cfg = json.loads((path / "generation_config.json").read_text())
    cfg.update(top_k=3, top_p=0.5, do_sample=True, temperature=0.7)
    (path / "generation_config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="session")
def jsonl_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "gsm8k_mini.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in PROBLEMS))
    return str(path)


def tiny_args(model_dir, dataset_path, **overrides):
    """Arguments for a run that takes seconds on a CPU."""
    defaults = dict(model_id=model_dir, dataset_path=dataset_path, num_steps=2, num_prompts=2, group_size=4,
                    num_minibatches=2, micro_batch_size=0, max_new_tokens=8, eval_size=2, eval_every=1,
                    eval_batch_size=2, learning_rate=1e-3, num_threads=1)
    return g.Args(**{**defaults, **overrides})


def load(model_dir, **overrides):
    args = tiny_args(model_dir, None, **overrides)
    model, tokenizer, eos_ids, _ = g.load_model(args, torch.device("cpu"), torch.float32)
    return args, model, tokenizer, eos_ids


# ---------------------------------------------------------------------------------------------
# Answer extraction and reward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, strict, flexible", [
    ("so the answer is \\boxed{18}.", "18", "18"),
    ("first \\boxed{3} then \\boxed{7}", "7", "7"),                    # the last box wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "\\frac{1}{2}"),          # nested braces
    ("\\boxed{\\$1,234.}", "1234", "1234"),                              # $, commas, trailing dot
    ("\\boxed{18 \\text{ dollars}}", "18", "18"),
    ("The total is \\boxed{18.50}", "18.50", "18.50"),
    ("\\boxed{-5}", "-5", "-5"),
    ("\\boxed{\u22127}", "-7", "-7"),                                    # Unicode minus sign
    ("it drops to \u22127 degrees", None, "-7"),
    ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72", "72"),  # GSM8k gold format
    ("#### $1,000.", "1000", "1000"),
    ("She has 3 apples, then 5, so 8.", None, "8"),                     # last number: flexible only
    ("It costs $2,500.", None, "2500"),
    ("no number here", None, None),
    ("", None, None),
    ("unclosed \\boxed{12 and then 13", None, "13"),                   # a cut-off box is no final answer
])
def test_extract_answer(text, strict, flexible):
    assert g.extract_answer(text, "strict") == strict
    assert g.extract_answer(text, "flexible") == flexible


@pytest.mark.parametrize("completion, gold, reward", [
    ("\\boxed{72}", "...\n#### 72", 1.0),
    ("\\boxed{18.5}", "18.50", 1.0),                                  # numerically equal
    ("\\boxed{18.50}", "#### 18.5", 1.0),
    ("\\boxed{1,200}", "#### 1200", 1.0),
    ("\\boxed{\u22123}", "#### -3", 1.0),
    ("\\boxed{71}", "#### 72", 0.0),
    ("garbage }}{{ \\boxed{", "#### 72", 0.0),                        # malformed: 0, no crash
    ("", "#### 72", 0.0),
    ("\\boxed{abc}", "#### 72", 0.0),
])
def test_gsm8k_reward(completion, gold, reward):
    assert g.gsm8k_reward(completion, gold) == reward
    assert g.gsm8k_reward(completion, gold, "flexible") == reward


@pytest.mark.parametrize("completion, strict, flexible", [
    ("48 + 24 = 72, so the answer is \\boxed{72", 0.0, 1.0),        # cut off inside the box
    ("48 + 24 = 72, so the answer is \\boxed{7", 0.0, 0.0),          # ... and maybe inside the number
    ("48 + 24 = 72, so the answer is", 0.0, 1.0),                     # cut off before the box
    ("The answer is 1,200", 0.0, 0.0),                                # gold is 72
])
def test_reward_of_truncated_completions_under_each_extraction_mode(completion, strict, flexible):
    assert g.gsm8k_reward(completion, "#### 72", "strict") == strict
    assert g.gsm8k_reward(completion, "#### 72", "flexible") == flexible


def test_format_reward_is_opt_in():
    assert g.gsm8k_reward("\\boxed{5}", "#### 72", format_reward=0.1) == pytest.approx(0.1)
    assert g.gsm8k_reward("\\boxed{72}", "#### 72", format_reward=0.1) == pytest.approx(1.1)
    assert g.gsm8k_reward("72", "#### 72", "flexible", format_reward=0.1) == 1.0  # correct but not boxed


def test_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = g.group_advantages(rewards, 4, "group", eps=1e-4)
    std = torch.tensor([1.0, 0, 0, 0]).std().item()  # Bessel-corrected std of one group: 0.5
    assert std == pytest.approx(0.5)
    expected_first = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-4)
    assert torch.allclose(adv[:4], expected_first, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(8))  # all-equal groups carry no signal, and no NaN
    # Dr. GRPO: no division by the group's std
    assert g.group_advantages(rewards, 4, "none").tolist() == [0.75, -0.25, -0.25, -0.25] + [0.0] * 8


# ---------------------------------------------------------------------------------------------
# The losses
# ---------------------------------------------------------------------------------------------
def _loss_inputs():
    ratios = torch.tensor([[1.5, 0.5, 1.15, 9.0], [0.85, 1.1, 1.0, 0.1]])
    mu = torch.log(torch.tensor([[0.2, 0.4, 0.5, 0.3], [0.5, 0.5, 0.1, 0.9]]))
    new = (mu + torch.log(ratios)).requires_grad_(True)
    advantages = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # the last column is padding
    return ratios, mu, new, advantages, mask


def test_vaco_token_loss_filters_tokens_that_move_away():
    ratios, mu, new, advantages, mask = _loss_inputs()
    loss, tv, filtered = g.vaco_token_loss(new, mu, advantages, mask, tv_threshold=0.1)
    # tv = ½ mean |ρ-1| over the 6 valid tokens: ½ (0.5+0.5+0.15+0.15+0.1+0) / 6; padding ignored
    assert tv.item() == pytest.approx(0.5 * 1.4 / 6)
    # A>0 with ρ>1 (1.5, 1.15) and A<0 with ρ<1 (0.85) move away from μ: filtered. ρ=1 is not.
    assert filtered.tolist() == [[True, False, True, False], [True, False, False, False]]
    # every valid token stays in the denominator: -(Σ ρA over all valid tokens) / 6
    expected = -(1.5 + 0.5 + 1.15 - 2 * (0.85 + 1.1 + 1.0)) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    grad = new.grad
    # d(-ρA/6)/d log π = -ρA/6 on kept tokens; exactly zero on filtered tokens and padding
    assert grad[0, 0] == 0 and grad[0, 2] == 0 and grad[1, 0] == 0 and grad[0, 3] == 0 and grad[1, 3] == 0
    assert grad[0, 1].item() == pytest.approx(-0.5 * 1.0 / 6)
    assert grad[1, 1].item() == pytest.approx(-1.1 * -2.0 / 6)
    assert grad[1, 2].item() == pytest.approx(-1.0 * -2.0 / 6)


def test_vaco_token_loss_below_threshold_filters_nothing():
    _, mu, new, advantages, mask = _loss_inputs()
    loss, tv, filtered = g.vaco_token_loss(new, mu, advantages, mask, tv_threshold=0.2)
    assert tv.item() < 0.2 and not filtered.any()
    loss.backward()
    assert (new.grad[:, :3] != 0).all() and (new.grad[:, 3] == 0).all()
    # a TV given from outside (the whole minibatch's) decides instead of this call's own
    _, _, filtered = g.vaco_token_loss(new, mu, advantages, mask, tv_threshold=0.2, tv=torch.tensor(0.3))
    assert filtered.sum() == 3


def test_losses_ignore_padding_values():
    ratios, mu, new, advantages, mask = _loss_inputs()
    other = new.detach().clone()
    other[:, 3] = 123.0  # change what sits under the padding
    for fn in (lambda n: g.vaco_token_loss(n, mu, advantages, mask, 0.1),
               lambda n: g.clip_token_loss(n, mu, advantages, mask, 0.2),
               lambda n: g.dppo_tv_token_loss(n, mu, advantages, mask, 0.07),
               lambda n: g.decoupled_token_loss(n, mu - 0.1, mu, advantages, mask, 0.2),
               lambda n: g.tis_token_loss(n, mu - 0.1, mu, advantages, mask, 0.2, 1.05),
               lambda n: g.m2po_token_loss(n, mu, advantages, mask, 0.04)):
        first, second = fn(new.detach()), fn(other)
        assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_clip_token_loss():
    ratios, mu, new, advantages, mask = _loss_inputs()
    loss, clipped = g.clip_token_loss(new, mu, advantages, mask, clip_coef=0.2)
    # A=+1: min(ρ, clip(ρ)) -> 1.2, 0.5, 1.15; A=-2: min(-2ρ, -2clip(ρ)) -> -2*0.85, -2*1.1, -2*1.0
    expected = -(1.2 + 0.5 + 1.15 - 2 * (0.85 + 1.1 + 1.0)) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # only ρ = 1.5 with A > 0 loses its gradient; ρ = 0.5 with A > 0 is outside [0.8, 1.2] but keeps it
    assert clipped.tolist() == [[True, False, False, False], [False, False, False, False]]
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1].item() == pytest.approx(-0.5 / 6)


def test_clip_with_zero_coef_has_the_gradient_of_vaco_with_its_filter_on():
    """ε = 0: ℓ = -min(ρA, A). Its gradient is -ρA where A(ρ - 1) ≤ 0 and 0 where A(ρ - 1) > 0: VACO's
    token rule with the switch on. Only the values differ (the clip's flat branch is A, VACO's sg(ρA))."""
    ratios, mu, new, advantages, mask = _loss_inputs()
    clip_new, vaco_new = new.detach().clone().requires_grad_(True), new.detach().clone().requires_grad_(True)
    clip_loss, clipped = g.clip_token_loss(clip_new, mu, advantages, mask, clip_coef=0.0)
    vaco_loss, _, filtered = g.vaco_token_loss(vaco_new, mu, advantages, mask, tv_threshold=0.0)
    # A=+1: min(1.5, 1), min(0.5, 1), min(1.15, 1); A=-2: min(-1.7, -2), min(-2.2, -2), min(-2, -2)
    assert clip_loss.item() == pytest.approx(-(1 + 0.5 + 1 - 2 - 2.2 - 2) / 6, rel=1e-5)
    assert torch.equal(clipped, filtered)  # ρ = 1 (row 2, token 3) keeps its gradient under both
    clip_loss.backward()
    vaco_loss.backward()
    assert torch.allclose(clip_new.grad, vaco_new.grad, atol=1e-7)
    assert clip_new.grad[1, 2].item() == pytest.approx(-1.0 * -2.0 / 6)  # the ρ = 1 token
    # with the switch off (TV ≤ δ) VACO is the unclipped policy gradient: -ρA/6 on every valid token
    off = new.detach().clone().requires_grad_(True)
    g.vaco_token_loss(off, mu, advantages, mask, tv_threshold=1.0)[0].backward()
    expected = -(ratios * advantages[:, None]) / 6 * mask
    assert torch.allclose(off.grad, expected, atol=1e-6)


def test_dppo_tv_token_loss_judges_each_probability_change():
    """A worked example: the mask looks at π - μ of each token, in the direction of A, not at the ratio."""
    mu = torch.log(torch.tensor([[0.01, 0.8, 0.3], [0.5, 0.6, 0.3]]))
    probs = torch.tensor([[0.05, 0.95, 0.9], [0.3, 0.62, 0.9]])  # the last column is padding
    new = torch.log(probs).requires_grad_(True)
    advantages, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, masked = g.dppo_tv_token_loss(new, mu, advantages, mask, delta=0.1)
    # A=+1: 0.01 -> 0.05 (ρ = 5, π - μ = 0.04 ≤ δ: kept, where PPO's clip would stop it);
    #       0.8 -> 0.95 (ρ = 1.19 inside PPO's clip, but π - μ = 0.15 > δ: masked).
    # A=-1: 0.5 -> 0.3 (π - μ = -0.2 < -δ: masked); 0.6 -> 0.62 (moved up, against A's push: kept).
    assert masked.tolist() == [[False, True, False], [True, False, False]]
    ratios = torch.tensor([[5.0, 0.95 / 0.8], [0.6, 0.62 / 0.6]])
    # the value is the ratio surrogate over all 4 valid tokens, masked ones included
    assert loss.item() == pytest.approx(-(5.0 + 0.95 / 0.8 - 0.6 - 0.62 / 0.6) / 4, rel=1e-5)
    loss.backward()
    # d(-ρA/4)/d log π = -ρA/4 on kept tokens, 0 on masked ones and on padding
    assert torch.allclose(new.grad, torch.tensor([[-5.0 / 4, 0.0, 0.0], [0.0, (0.62 / 0.6) / 4, 0.0]]), atol=1e-6)
    assert new.grad[0, 1] == 0 and new.grad[1, 0] == 0 and new.grad[:, 2].eq(0).all()  # exactly 0
    # the same gradient as verl's form of the loss, -A · sg(ρ) · log π on the kept tokens
    other = torch.log(probs).requires_grad_(True)
    keep = (mask.bool() & ~masked).float()
    (-(advantages[:, None] * torch.nn.functional.pad(ratios, (0, 1)) * other * keep).sum() / 4).backward()
    assert torch.allclose(new.grad, other.grad, atol=1e-6)


def test_clip_higher_and_the_low_clip_region():
    _, mu, _, _, mask = _loss_inputs()
    ratios = torch.tensor([[1.5, 0.5, 1.25, 1.0], [0.7, 1.5, 0.75, 1.0]])
    new = (mu + torch.log(ratios)).requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0])
    loss, clipped = g.clip_token_loss(new, mu, advantages, mask, clip_coef=0.2, epsilon_high=0.28)
    # A=+1: upper bound 1.28 -> 1.28, 0.5, 1.25 (kept); A=-1: lower bound 0.8 -> -0.8, -1.5, -0.8
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.25 - 0.8 - 1.5 - 0.8) / 6, rel=1e-5)
    assert clipped.tolist() == [[True, False, False, False], [True, False, True, False]]
    loss.backward()
    assert (new.grad[clipped] == 0).all() and (new.grad[mask.bool() & ~clipped] != 0).all()


def _proximal():
    """π_prox for `_loss_inputs`: w = π_prox/μ per token (last column padding), so r = π_θ/π_prox = ρ/w."""
    ratios, mu, new, advantages, mask = _loss_inputs()
    weights = torch.tensor([[1.0, 2.0, 0.5, 7.0], [2.0, 0.5, 0.5, 3.0]])
    return weights, mu + torch.log(weights), mu, new, advantages, mask


def test_decoupled_loss_clips_around_the_proximal_policy_and_weights_by_it():
    weights, prox, mu, new, advantages, mask = _proximal()
    loss, clipped, weight = g.decoupled_token_loss(new, prox, mu, advantages, mask, clip_coef=0.2)
    # r = ρ/w: A = +1: 1.5, 0.25, 2.3;  A = -2: 0.425, 2.2, 2.0
    # w·min(rA, clip(r)A): 1·1.2, 2·0.25, 0.5·1.2;  2·(-2·0.8), 0.5·(-2·2.2), 0.5·(-2·2.0)
    assert loss.item() == pytest.approx(-(1.2 + 0.5 + 0.6 - 3.2 - 2.2 - 2.0) / 6, rel=1e-5)
    # the clip binds on r, not on ρ: r = 1.5, 2.3 with A > 0 and r = 0.425 with A < 0 (ρ = 0.85 is inside the clip)
    assert clipped.tolist() == [[True, False, True, False], [True, False, False, False]]
    assert torch.allclose(weight[:, :3], weights[:, :3]) and (weight[:, 3] == 1).all()  # 1 on padding
    loss.backward()
    # d(-w r A / 6)/d log π_θ = -w r A / 6 on kept tokens; 0 on clipped tokens and padding
    expected = torch.tensor([[0.0, -2 * 0.25 / 6, 0.0, 0.0], [0.0, 0.5 * 2.2 * 2 / 6, 0.5 * 2.0 * 2 / 6, 0.0]])
    assert torch.allclose(new.grad, expected, atol=1e-6)


def test_decoupled_loss_is_ppo_clip_when_the_proximal_policy_is_the_behaviour_policy():
    _, mu, new, advantages, mask = _loss_inputs()
    a, b = new.detach().clone().requires_grad_(True), new.detach().clone().requires_grad_(True)
    clip_loss, clipped = g.clip_token_loss(a, mu, advantages, mask, clip_coef=0.2)
    decoupled_loss, decoupled_clipped, _ = g.decoupled_token_loss(b, mu, mu, advantages, mask, clip_coef=0.2)
    assert decoupled_loss.item() == pytest.approx(clip_loss.item()) and torch.equal(clipped, decoupled_clipped)
    clip_loss.backward()
    decoupled_loss.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7)


def test_tis_truncates_the_weight_of_the_decoupled_loss():
    weights, prox, mu, new, advantages, mask = _proximal()
    loss, clipped, weight = g.tis_token_loss(new, prox, mu, advantages, mask, clip_coef=0.2, cap=1.5)
    # w = 2 becomes 1.5 (tokens (0, 1) and (1, 0)); the others are below C and unchanged
    assert torch.allclose(weight[:, :3], torch.tensor([[1.0, 1.5, 0.5], [1.5, 0.5, 0.5]]))
    assert loss.item() == pytest.approx(-(1.2 + 1.5 * 0.25 + 0.6 - 1.5 * 1.6 - 2.2 - 2.0) / 6, rel=1e-5)
    assert clipped.tolist() == [[True, False, True, False], [True, False, False, False]]
    loss.backward()
    # the truncated weight scales the gradient of a kept token: -1.5 · 0.25 · 1 / 6 instead of -2 · 0.25 / 6
    expected = torch.tensor([[0.0, -1.5 * 0.25 / 6, 0.0, 0.0], [0.0, 0.5 * 2.2 * 2 / 6, 0.5 * 2.0 * 2 / 6, 0.0]])
    assert torch.allclose(new.grad, expected, atol=1e-6)


def test_m2po_masks_the_largest_squared_log_ratios_until_the_second_moment_is_under_the_bound():
    ratios, mu, new, advantages, mask = _loss_inputs()
    # (log ρ)² of the valid tokens, sorted: 0.4805 (ρ = 0.5), 0.1644 (1.5), 0.0264 (0.85), 0.0195 (1.15), 0.0091, 0
    # means of the largest-first suffixes: 0.1166, 0.0439, 0.0138, ...: under τ = 0.04 once the two largest go
    loss, masked = g.m2po_token_loss(new, mu, advantages, mask, bound=0.04)
    assert masked.tolist() == [[True, True, False, False], [False, False, False, False]]
    kept = torch.log(ratios[:, :3])[~masked[:, :3]] ** 2
    assert kept.mean() < 0.04 < torch.log(torch.tensor([1.5, 1.15, 0.85, 1.1, 1.0])).pow(2).mean()  # one fewer: over τ
    # ℓ = -M ρ A, token mean over all 6 valid tokens (masked ones stay in the denominator), no clipping
    assert loss.item() == pytest.approx(-(1.15 - 2 * (0.85 + 1.1 + 1.0)) / 6, rel=1e-5)
    loss.backward()
    expected = torch.tensor([[0.0, 0.0, -1.15 / 6, 0.0], [0.85 * 2 / 6, 1.1 * 2 / 6, 1.0 * 2 / 6, 0.0]])
    assert torch.allclose(new.grad, expected, atol=1e-6)
    # a looser bound masks only the largest; a bound above the mean masks nothing
    assert g.m2po_token_loss(new, mu, advantages, mask, bound=0.05)[1].sum() == 1
    assert not g.m2po_token_loss(new, mu, advantages, mask, bound=0.2)[1].any()
    # a cutoff given from outside (the whole minibatch's) decides instead of this call's own
    assert g.m2po_token_loss(new, mu, advantages, mask, bound=0.2, cutoff=0.02)[1].sum() == 3


def test_m2po_masks_every_token_tied_at_the_cutoff_and_all_when_none_is_under_the_bound():
    advantages, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    mu = torch.zeros(2, 2)
    # (log ρ)² = 0.09, 0.09, 0.09, 0: masking two of the equal three would bring the mean under 0.05 (0.045),
    # but which two is arbitrary, so all three tied at the cutoff go: the kept mean is 0
    new = torch.tensor([[0.3, -0.3], [0.3, 0.0]], requires_grad=True)
    loss, masked = g.m2po_token_loss(new, mu, advantages, mask, bound=0.05)
    assert masked.tolist() == [[True, True], [True, False]]
    loss.backward()  # the kept token's gradient, ρ A / 4 with ρ = 1 and A = -1: masked tokens stay in the mean
    assert new.grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 0.25])
    # every (log ρ)² at or above τ: only the empty set meets the bound, so every token is masked, no gradient
    new = torch.tensor([[0.5, -0.5], [0.6, -0.4]], requires_grad=True)
    loss, masked = g.m2po_token_loss(new, mu, advantages, mask, bound=0.1)
    assert masked.all() and loss.item() == 0.0
    loss.backward()
    assert not new.grad.any()


def test_m2po_cutoff_is_the_fewest_largest_values_against_brute_force():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        values = torch.rand(int(torch.randint(1, 12, (1,), generator=generator)), generator=generator) ** 3
        bound = float(torch.rand(1, generator=generator)) * 0.3
        ordered = sorted(values.tolist(), reverse=True)
        fewest = next((k for k in range(len(ordered)) if sum(ordered[k:]) / (len(ordered) - k) < bound), len(ordered))
        cutoff = g.m2po_cutoff(values, bound)
        assert int((values >= cutoff).sum()) == fewest, (trial, values, bound)


def test_k3_kl_values_direction_and_expectation():
    new = torch.log(torch.tensor([0.5, 0.25, 0.25])).requires_grad_(True)
    ref = torch.log(torch.tensor([0.25, 0.5, 0.25]))
    k3 = g.k3_kl(new, ref)
    # k3 = π_ref/π_θ - log(π_ref/π_θ) - 1: 0.5 + log 2 - 1, 2 - log 2 - 1, 0  (swapped arguments would
    # give 2 - log 2 - 1 first; k2 = ½ log² gives 0.240)
    assert k3.tolist() == pytest.approx([0.5 + math.log(2) - 1, 1 - math.log(2), 0.0], abs=1e-6)
    # summed under π_θ it is exactly KL(π_θ ‖ π_ref) = Σ π_θ log(π_θ/π_ref)
    kl = (0.5 * math.log(2) + 0.25 * math.log(0.5))
    assert (new.exp() * k3).sum().item() == pytest.approx(kl, abs=1e-6)
    # its gradient pushes log π_θ towards log π_ref: d k3 / d log π_θ = 1 - π_ref/π_θ
    k3.sum().backward()
    assert new.grad.tolist() == pytest.approx([0.5, -1.0, 0.0], abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Sampling, log-probs, forward lag, micro-batching
# ---------------------------------------------------------------------------------------------
def test_tokenizer_round_trip_and_eos(tiny_model_dir):
    _, model, tokenizer, eos_ids = load(tiny_model_dir)
    text = "Weng earns $12 an hour. \\boxed{1,200}"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer.eos_token_id in eos_ids.tolist() and tokenizer.padding_side == "left"
    prompt = g.build_prompt(tokenizer, "What is 2+3?", "Answer.")
    assert prompt == "<|im_start|>user\nWhat is 2+3?\nAnswer.<|im_end|>\n<|im_start|>assistant\n"


def test_completion_mask_stops_after_first_eos():
    completions = torch.tensor([[5, 6, 2, 0, 0], [7, 2, 2, 2, 2], [8, 9, 10, 11, 12]])
    mask = g.completion_mask_from(completions, torch.tensor([2]))
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_behaviour_logprobs_are_those_of_the_temperature_scaled_sampler(tiny_model_dir):
    """Draw many first tokens at T = 0.5: their frequencies match exp(completion_logprobs at T),
    and the model's saved top_k=3 / top_p=0.5 defaults are not applied."""
    _, model, tokenizer, eos_ids = load(tiny_model_dir)
    with torch.no_grad():  # sharpen the random model: at T = 0.5 its top first token gets p ≈ 0.27
        model.model.embed_tokens.weight.mul_(2.0)
    prompt = g.build_prompt(tokenizer, "Say something.", "")
    torch.manual_seed(0)
    n, T = 3000, 0.5
    ids, attn, mask = g.sample_completions(model, tokenizer, [prompt] * n, 1, T, True, eos_ids, g.nullcontext())
    logprobs, _ = g.completion_logprobs(model, ids[:1], attn[:1], 1, T)
    # the full first-token distribution at temperature T
    with torch.no_grad():
        logits = model(**tokenizer([prompt], return_tensors="pt", add_special_tokens=False)).logits[0, -1]
    probs = torch.softmax(logits / T, -1)
    assert torch.exp(logprobs[0, 0]).item() == pytest.approx(probs[ids[0, -1]].item(), rel=1e-4)
    counts = torch.bincount(ids[:, -1], minlength=len(probs)).float()
    top = probs.topk(5).indices
    assert 0.1 < probs[top[0]] < 0.5  # a distribution the check below can tell apart from others
    # frequencies of the 5 likeliest tokens and of the first alone match softmax(z / T) (±4σ);
    # softmax(z) (wrong T) would give p ≈ 0.04 and top_k=3 sampling p ≈ 0.9 for the first
    sigma = (probs[top] * (1 - probs[top]) / n).sqrt()
    assert ((counts[top] / n - probs[top]).abs() < 4 * sigma + 1e-3).all()
    assert (counts > 0).sum() > 50  # top_k=3 / top_p=0.5 from the saved generation config were ignored


def test_logprobs_and_entropy_match_a_full_log_softmax(tiny_model_dir):
    """The sequence-at-a-time log-probs (checkpointed when gradients are on) and the entropy from the
    logsumexp equal the textbook log_softmax computation, values and gradients."""
    _, model, tokenizer, eos_ids = load(tiny_model_dir)
    torch.manual_seed(0)
    prompts = [g.build_prompt(tokenizer, q, "") for q, _ in PROBLEMS[:3]]
    ids, attn, mask = g.sample_completions(model, tokenizer, prompts, 5, 1.0, True, eos_ids, g.nullcontext())
    C, T = mask.shape[1], 0.7
    logprobs, entropy = g.completion_logprobs(model, ids, attn, C, T, with_entropy=True)
    grads = torch.autograd.grad(logprobs.sum(), model.model.embed_tokens.weight)[0]
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    z = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, -C - 1 : -1] / T
    log_p = torch.log_softmax(z, -1)
    expected = log_p.gather(-1, ids[:, -C:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-5)
    assert torch.allclose(entropy, -(log_p.exp() * log_p).sum(-1), atol=1e-4)
    expected_grads = torch.autograd.grad(expected.sum(), model.model.embed_tokens.weight)[0]
    assert torch.allclose(grads, expected_grads, atol=1e-5)


def _step(model_dir, seed=0, **overrides):
    """One training step (S = 0) on the tiny model with a plain SGD optimiser; returns (model, stats)."""
    args, model, tokenizer, eos_ids = load(model_dir, **overrides)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    ref_model = copy.deepcopy(model).requires_grad_(False) if args.beta > 0 else None
    prompts = [g.build_prompt(tokenizer, q, "") for q, _ in PROBLEMS[:2]]
    torch.manual_seed(seed)
    batch = g.generate_batch(model, tokenizer, prompts, ["1", "2"], lambda text, gold: float(len(text) % 2), args,
                             eos_ids, generator=torch.Generator().manual_seed(seed), version=1)
    stats = g.train_on_batch(model, optimizer, batch, args, step=1, ref_model=ref_model)
    return model, stats


# N = 2 minibatches of 4 sequences; a big SGD step so that minibatch 1 sees real lag
LAG = dict(num_minibatches=2, group_size=4, learning_rate=3.0, max_new_tokens=6, max_grad_norm=1e9)


@pytest.fixture(scope="module")
def micro_batch_tvs(tiny_model_dir):
    """The own TV of each single-sequence micro-batch of minibatch 1, and the minibatch's TV."""
    seen = []
    real = g.vaco_token_loss

    def spy(newlogprobs, mu_logprobs, advantages, mask, *rest, **kwargs):
        valid = mask.bool()
        ratio = torch.exp(torch.where(valid, newlogprobs.detach() - mu_logprobs, 0.0))
        seen.append((0.5 * (ratio - 1).abs().sum() / valid.sum()).item())
        return real(newlogprobs, mu_logprobs, advantages, mask, *rest, **kwargs)

    g.vaco_token_loss = spy
    try:
        _, stats = _step(tiny_model_dir, loss="vaco", micro_batch_size=1, tv_threshold=1e9, **LAG)
    finally:
        g.vaco_token_loss = real
    return sorted({round(tv, 7) for tv in seen if tv > 0}), stats["per_minibatch"][1]["tv"]


@pytest.mark.parametrize("loss", ["clip", "vaco"])
@pytest.mark.parametrize("side", ["below", "above"])
def test_micro_batching_gives_the_one_batch_gradient_and_the_minibatch_tv_switches(tiny_model_dir, micro_batch_tvs,
                                                                                    loss, side):
    """δ lies between the minibatch's TV and the own TVs of some of its micro-batches: `below` (some
    micro-batches under δ, the minibatch above: all are filtered) or `above` (the minibatch under δ, some
    micro-batches above: none is). A switch decided per micro-batch would change the gradient and the
    logged filtered fraction; under `clip` the logged "would filter" follows the same rule."""
    micro_tvs, tv = micro_batch_tvs
    if side == "below":
        delta = (max(t for t in micro_tvs if t < tv) + tv) / 2
    else:
        delta = (min(t for t in micro_tvs if t > tv) + tv) / 2
    common = dict(loss=loss, tv_threshold=delta, **LAG)
    one_batch, stats = _step(tiny_model_dir, micro_batch_size=0, **common)
    micro, micro_stats = _step(tiny_model_dir, micro_batch_size=1, **common)
    mb, micro_mb = stats["per_minibatch"], micro_stats["per_minibatch"]
    # minibatch 0 is trained by the policy that generated it: ρ = 1 exactly, no TV, nothing filtered
    assert mb[0]["tv"] < 1e-6 and abs(mb[0]["ratio_min"] - 1) < 1e-5 and abs(mb[0]["ratio_max"] - 1) < 1e-5
    assert mb[0]["filter_on"] == 0 and mb[0]["filtered_fraction"] == 0
    # minibatch 1 is one optimiser step late: the lag shows; the switch follows the minibatch's TV
    assert mb[1]["tv"] == pytest.approx(tv, rel=1e-5) and mb[1]["tv"] > 1e-3
    assert mb[1]["filter_on"] == micro_mb[1]["filter_on"] == float(side == "below")
    assert (mb[1]["filtered_fraction"] > 0) == (side == "below")
    assert micro_mb[1]["filtered_fraction"] == pytest.approx(mb[1]["filtered_fraction"], abs=1e-6)
    assert stats["completions"] == micro_stats["completions"]
    for a, b in zip(one_batch.parameters(), micro.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert [m["tv"] for m in mb] == pytest.approx([m["tv"] for m in micro_mb], rel=1e-4, abs=1e-6)


def test_forward_lag_with_four_minibatches(tiny_model_dir):
    common = dict(LAG, loss="vaco", num_minibatches=4, learning_rate=1.0, tv_threshold=0.01)
    one_batch, stats = _step(tiny_model_dir, micro_batch_size=0, **common)
    micro, micro_stats = _step(tiny_model_dir, micro_batch_size=1, **common)
    mb = stats["per_minibatch"]
    assert len(mb) == 4 and mb[0]["tv"] < 1e-6 and mb[0]["filter_on"] == 0
    assert all(m["tv"] > 1e-3 for m in mb[1:])  # every later minibatch is trained by a newer policy
    assert [m["filter_on"] for m in mb] == [float(m["tv"] > 0.01) for m in mb]
    assert all(m["filtered_fraction"] == 0 for m in mb if not m["filter_on"]) and mb[3]["filtered_fraction"] > 0
    assert [m["tv"] for m in mb] == pytest.approx([m["tv"] for m in micro_stats["per_minibatch"]], rel=1e-4, abs=1e-6)
    for a, b in zip(one_batch.parameters(), micro.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_kl_term_is_zero_at_minibatch_zero_and_changes_the_gradient_later(tiny_model_dir):
    # N = 1: π_θ = π_ref on the only minibatch, so the k3 term and its gradient are 0: the same update, to
    # rounding (the graph with the term is another program; without vector units it rounds 1 ulp apart)
    common = dict(LAG, loss="clip")
    without, _ = _step(tiny_model_dir, **{**common, "num_minibatches": 1})
    with_kl, stats = _step(tiny_model_dir, **{**common, "num_minibatches": 1, "beta": 1.0})
    assert stats["per_minibatch"][0]["kl"] == 0
    for a, b in zip(without.parameters(), with_kl.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # N = 2: minibatch 1 is trained by π_θ1 ≠ π_ref: KL > 0 and a different update
    without, _ = _step(tiny_model_dir, **common)
    with_kl, stats = _step(tiny_model_dir, **common, beta=1.0)
    assert stats["per_minibatch"][0]["kl"] == 0 and stats["per_minibatch"][1]["kl"] > 1e-4
    assert not all(torch.allclose(a, b) for a, b in zip(without.parameters(), with_kl.parameters()))


def test_vaco_at_delta_zero_trains_as_clip_at_epsilon_zero(tiny_model_dir):
    """A whole step, N = 2: minibatch 0 has ρ = 1 (no TV, VACO's filter off, the clip's bounds [1, 1]
    do not bind); minibatch 1 has TV > 0 = δ (filter on). The two losses give the same update."""
    clip, clip_stats = _step(tiny_model_dir, **{**LAG, "loss": "clip", "clip_coef": 0.0})
    vaco, vaco_stats = _step(tiny_model_dir, **{**LAG, "loss": "vaco", "tv_threshold": 0.0})
    assert [m["filter_on"] for m in vaco_stats["per_minibatch"]] == [0.0, 1.0]
    assert vaco_stats["per_minibatch"][1]["filtered_fraction"] > 0
    for a, b in zip(clip.parameters(), vaco.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    # ... and DPPO's mask with a δ that no probability change reaches is VACO with its filter never on
    dppo, dppo_stats = _step(tiny_model_dir, **{**LAG, "loss": "dppo-tv", "dppo_delta": 0.999})
    unfiltered, _ = _step(tiny_model_dir, **{**LAG, "loss": "vaco", "tv_threshold": 1e9})
    assert all(m["masked_fraction"] == 0 for m in dppo_stats["per_minibatch"])
    for a, b in zip(dppo.parameters(), unfiltered.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(dppo.parameters(), vaco.parameters()))
    # with a small δ (this random model's probabilities are ~1/300) the mask acts on the stale minibatch
    # only: at minibatch 0, π = μ
    _, stats = _step(tiny_model_dir, **{**LAG, "loss": "dppo-tv", "dppo_delta": 0.0005})
    assert stats["per_minibatch"][0]["masked_fraction"] == 0 and stats["per_minibatch"][1]["masked_fraction"] > 0


def test_truncated_completions_get_no_gradient_when_masked(tiny_model_dir):
    common = dict(LAG, loss="clip", max_new_tokens=3)
    before = load(tiny_model_dir)[1]
    unmasked, stats = _step(tiny_model_dir, **common)
    assert stats["truncated"].all() and stats["rewards"].std() > 0  # every completion is cut off, A ≠ 0
    assert not all(torch.equal(a, b) for a, b in zip(before.parameters(), unmasked.parameters()))
    masked, stats = _step(tiny_model_dir, **common, mask_truncated_completions=True)
    assert all(torch.equal(a, b) for a, b in zip(before.parameters(), masked.parameters()))
    assert all(m["loss"] == 0 for m in stats["per_minibatch"])


def test_dropout_is_off_in_training_passes(tiny_model_dir, tmp_path):
    """A model saved with attention dropout 0.5: the script switches it off, so ρ = 1 at zero lag."""
    shutil.copytree(tiny_model_dir, tmp_path / "dropout")
    config = json.loads((tmp_path / "dropout" / "config.json").read_text())
    (tmp_path / "dropout" / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    _, model, _, _ = load(str(tmp_path / "dropout"))
    assert model.model.layers[0].self_attn.attention_dropout == 0.0
    _, stats = _step(str(tmp_path / "dropout"), **LAG)
    mb = stats["per_minibatch"]
    assert mb[0]["tv"] == 0 and mb[0]["ratio_min"] == mb[0]["ratio_max"] == 1.0
    layers = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.3))
    g.disable_dropout(layers)
    assert layers[1].p == 0.0


def test_evaluation_is_greedy_and_deterministic(tiny_model_dir):
    args, model, tokenizer, eos_ids = load(tiny_model_dir, max_new_tokens=6, eval_batch_size=4)
    problems = [(q, "72") for q, _ in PROBLEMS[:3]] + [("What is 70 + 2?", "72")]
    torch.manual_seed(0)
    first = g.evaluate(model, tokenizer, problems, args, eos_ids, g.nullcontext())
    torch.manual_seed(1)
    second = g.evaluate(model, tokenizer, problems, args, eos_ids, g.nullcontext())
    assert first == second
    # the completion is the argmax continuation, token by token
    ids = tokenizer([g.build_prompt(tokenizer, problems[0][0], args.instruction)], return_tensors="pt",
                    add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        for _ in range(args.max_new_tokens):
            next_id = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            if next_id.item() in eos_ids.tolist():
                break
    n_prompt = len(tokenizer(g.build_prompt(tokenizer, problems[0][0], args.instruction), add_special_tokens=False)["input_ids"])
    assert first[1][0] == tokenizer.decode(ids[0, n_prompt:], skip_special_tokens=True)
    # rewards follow the completions
    assert first[2] == [g.gsm8k_reward(text, "72") for text in first[1]] and first[0] == sum(first[2]) / 4


def _staleness_run(model_dir, jsonl_path, monkeypatch, tmp_path, staleness, loss="clip"):
    """A 4-step run at the given S, with a stand-in reward (1 for an even number of characters) so that the
    policy moves; records the weights at each step's start and the batch each step trains on."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(g, "gsm8k_reward", lambda text, gold, mode="strict", format_reward=0.0: float(len(text) % 2 == 0))
    states, batches, real = {}, {}, g.train_on_batch

    def spy(model, optimizer, batch, args, step, *rest, **kwargs):
        states[step], batches[step] = copy.deepcopy(model.state_dict()), batch
        return real(model, optimizer, batch, args, step, *rest, **kwargs)

    monkeypatch.setattr(g, "train_on_batch", spy)
    args = tiny_args(model_dir, jsonl_path, num_steps=4, staleness=staleness, loss=loss, learning_rate=3e-3,
                     eval_size=2, eval_every=0, eval_before=False, final_eval=False)
    result = g.main(args)
    (run_dir,) = (tmp_path / "runs").glob(f"*S{staleness}__*")
    return args, states, batches, read_scalars(run_dir), result


def test_staleness_trains_on_the_batch_of_the_policy_s_steps_back(tiny_model_dir, jsonl_path, monkeypatch, tmp_path):
    """S = 2: step t trains on the batch generated by the policy of step t - 2 (steps 1 and 2: by the initial
    policy), whose μ log-probs came with it; backward TV > 0 from the first stale step on."""
    args, states, batches, scalars, _ = _staleness_run(tiny_model_dir, jsonl_path, monkeypatch, tmp_path, 2)
    assert [batches[t]["version"] for t in range(1, 5)] == [1, 1, 1, 2]
    assert scalars["lag/batch_age"] == [0, 1, 2, 2]
    model = g.load_model(args, torch.device("cpu"), torch.float32)[0]

    def logprobs_of(state, batch):
        model.load_state_dict(state)
        return g.batch_logprobs(model, batch, args)[batch["completion_mask"].bool()]

    for t in (3, 4):
        mu = batches[t]["mu_logprobs"][batches[t]["completion_mask"].bool()]
        assert torch.allclose(mu, logprobs_of(states[t - 2], batches[t]), atol=1e-6)  # the policy of step t - 2
        for other in (t - 1, t):  # neither a newer policy's nor the learner's own
            assert not torch.allclose(mu, logprobs_of(states[other], batches[t]), atol=1e-4)
    # backward TV = ½ mean |π_prox/μ - 1| over the batch's tokens, π_prox the learner at the step's start
    for t in range(1, 5):
        mu = batches[t]["mu_logprobs"][batches[t]["completion_mask"].bool()]
        expected = 0.5 * (torch.exp(logprobs_of(states[t], batches[t]) - mu) - 1).abs().mean().item()
        assert scalars["lag/tv_backward"][t - 1] == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert scalars["lag/tv_backward"][0] == 0 and all(tv > 1e-3 for tv in scalars["lag/tv_backward"][1:])
    # minibatch 0 is trained by π_prox: the forward lag adds nothing to it, and something to minibatch 1
    assert scalars["lag/tv_forward_minibatch_0"] == [0.0] * 4
    assert all(tv > 0 for tv in scalars["lag/tv_forward_minibatch_1"])
    assert all(tv > 0 for tv in scalars["lag/tv_minibatch_0"][1:])  # but its TV to μ is the backward lag's


def test_no_staleness_trains_on_the_batch_of_the_current_policy(tiny_model_dir, jsonl_path, monkeypatch, tmp_path):
    args, states, batches, scalars, _ = _staleness_run(tiny_model_dir, jsonl_path, monkeypatch, tmp_path, 0)
    assert [batches[t]["version"] for t in range(1, 5)] == [1, 2, 3, 4] and scalars["lag/batch_age"] == [0] * 4
    assert scalars["lag/tv_backward"] == [0.0] * 4 and scalars["lag/tv_minibatch_0"] == [0.0] * 4
    model = g.load_model(args, torch.device("cpu"), torch.float32)[0]
    for t in range(1, 5):
        model.load_state_dict(states[t])
        valid = batches[t]["completion_mask"].bool()
        assert torch.equal(g.batch_logprobs(model, batches[t], args)[valid], batches[t]["mu_logprobs"][valid])


@pytest.mark.parametrize("loss", ["decoupled", "tis", "m2po"])
def test_new_losses_train_under_staleness_and_log_their_statistics(tiny_model_dir, jsonl_path, monkeypatch,
                                                                   tmp_path, loss):
    _, _, _, scalars, _ = _staleness_run(tiny_model_dir, jsonl_path, monkeypatch, tmp_path, 2, loss)
    for tag in ("losses/is_weight_mean", "losses/tis_capped_fraction", "losses/clip_fraction_prox", "losses/m2",
                "losses/m2po_masked_fraction", "losses/tv_forward", "lag/m2po_masked_fraction_minibatch_1"):
        assert len(scalars[tag]) == 4, tag
    assert scalars["losses/is_weight_mean"][0] == pytest.approx(1.0)  # step 1: π_prox = μ
    assert scalars["losses/m2"][0] > 0  # minibatch 1 of step 1 is one update from μ


@pytest.mark.parametrize("loss", ["decoupled", "tis", "m2po"])
def test_a_stale_step_is_the_loss_of_the_stored_and_the_proximal_log_probs(tiny_model_dir, loss):
    """A batch one update old, so π_prox ≠ μ: the step's update is the gradient of the loss function fed μ's
    stored log-probs and π_prox's (recomputed here by hand): not with either taken for the other, nor another loss's."""
    # ε = 0.05: the clip on ρ = π_prox/μ binds on some tokens, the clip on r = π_θ/π_prox = 1 on none
    args, model, tokenizer, eos_ids = load(tiny_model_dir, **{**LAG, "num_minibatches": 1, "loss": loss,
                                                             "clip_coef": 0.05})
    prompts = [g.build_prompt(tokenizer, q, "") for q, _ in PROBLEMS[:2]]
    torch.manual_seed(0)
    batch = g.generate_batch(model, tokenizer, prompts, ["1", "2"], lambda text, gold: float(len(text) % 2), args,
                             eos_ids, generator=torch.Generator().manual_seed(0), version=1)
    with torch.no_grad():  # the learner has moved on since μ generated the batch
        for p in model.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    mu, mask, adv = batch["mu_logprobs"], batch["completion_mask"], batch["advantages"]
    prox = g.batch_logprobs(model, batch, args)
    valid = mask.bool()
    weights, sq = torch.exp(prox - mu)[valid], (prox - mu)[valid] ** 2  # at the only update π_θ = π_prox
    args = replace(args, tis_cap=float(weights.median()), m2po_bound=float(sq.mean()) / 4)  # both bind

    def update(fn):
        other = copy.deepcopy(model)
        new = g.completion_logprobs(other, batch["input_ids"], batch["attention_mask"], mask.shape[1], args.temperature)[0]
        fn(new).backward()
        return [-args.learning_rate * p.grad for p in other.parameters()]

    clip, cap, bound = args.clip_coef, args.tis_cap, args.m2po_bound
    losses = {"decoupled": lambda new, prox, mu: g.decoupled_token_loss(new, prox, mu, adv, mask, clip)[0],
              "tis": lambda new, prox, mu: g.tis_token_loss(new, prox, mu, adv, mask, clip, cap)[0],
              "m2po": lambda new, prox, mu: g.m2po_token_loss(new, mu, adv, mask, bound)[0]}
    expected = update(lambda new: losses[loss](new, prox, mu))
    wrong = [update(lambda new: losses[loss](new, prox, prox)),  # π_prox taken for μ (M2PO: AReaL's measure)
             update(lambda new: losses["decoupled" if loss == "tis" else "tis"](new, prox, mu))]
    if loss != "m2po":  # μ taken for π_prox: PPO-clip on ρ
        wrong.append(update(lambda new: losses[loss](new, mu, mu)))
    before = [p.detach().clone() for p in model.parameters()]
    stats = g.train_on_batch(model, torch.optim.SGD(model.parameters(), lr=args.learning_rate), batch, args, step=2)
    assert stats["age"] == 1 and stats["tv_backward"] > 0.01
    done = [p.detach() - b for p, b in zip(model.parameters(), before)]
    close = lambda a, b: all(torch.allclose(x, y, rtol=1e-4, atol=1e-7) for x, y in zip(a, b))  # noqa: E731
    assert close(done, expected) and not any(close(done, w) for w in wrong)


def test_decoupled_and_clip_take_the_same_step_without_staleness(tiny_model_dir):
    """S = 0: π_prox = μ, so the decoupled loss (and TIS, whose weights are all 1) is PPO-clip."""
    clip, clip_stats = _step(tiny_model_dir, **{**LAG, "loss": "clip"})
    for loss in ("decoupled", "tis"):
        other, stats = _step(tiny_model_dir, **{**LAG, "loss": loss})
        assert stats["completions"] == clip_stats["completions"]
        for a, b in zip(clip.parameters(), other.parameters()):
            assert torch.allclose(a, b, atol=1e-6)


def test_m2po_micro_batching_gives_the_one_batch_gradient(tiny_model_dir):
    """M2PO's cutoff belongs to the minibatch: micro-batches of one sequence give the one-batch update."""
    common = dict(LAG, loss="m2po", m2po_bound=1e-4)
    one_batch, stats = _step(tiny_model_dir, micro_batch_size=0, **common)
    micro, micro_stats = _step(tiny_model_dir, micro_batch_size=1, **common)
    assert stats["per_minibatch"][1]["m2po_masked_fraction"] > 0
    for a, b in zip(one_batch.parameters(), micro.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Evaluation: pass@k
# ---------------------------------------------------------------------------------------------
def test_pass_at_k_against_its_closed_form_and_brute_force():
    assert g.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3, 2) / C(5, 2)
    assert g.pass_at_k(4, 0, 3) == 0 and g.pass_at_k(4, 1, 4) == 1 and g.pass_at_k(6, 3, 1) == pytest.approx(0.5)
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):  # every k-subset of n samples, c of them correct
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                assert g.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        g.pass_at_k(3, 1, 4)


def test_sampled_evaluation_reports_mean_and_pass_at_k(tiny_model_dir, jsonl_path, monkeypatch, tmp_path):
    """mean@n and pass@k are computed from the n sampled completions of each problem, problem by problem."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(g, "gsm8k_reward", lambda text, gold, mode="strict", format_reward=0.0: float(len(text) % 2))
    seen, real = [], g.evaluate

    def spy(*a, **kwargs):
        out = real(*a, **kwargs)
        seen.append((a[2], kwargs.get("samples", a[6] if len(a) > 6 else 0), out[2]))
        return out

    monkeypatch.setattr(g, "evaluate", spy)
    result = g.main(tiny_args(tiny_model_dir, jsonl_path, num_steps=1, eval_every=0, eval_samples=3, pass_k=2))
    problems, samples, rewards = seen[-1]
    assert samples == 3 and len(problems) == 2 and len(rewards) == 6
    per_problem = [rewards[:3], rewards[3:]]
    assert result["mean_at_n"] == pytest.approx(sum(rewards) / 6)
    assert result["pass_at_k"] == pytest.approx(sum(g.pass_at_k(3, int(sum(r)), 2) for r in per_problem) / 2)
    assert 0 < result["mean_at_n"] < 1  # the samples differ: this checks sampling, not greedy decoding


def test_test_path_is_the_test_split_and_nothing_is_held_out(tiny_model_dir, jsonl_path, tmp_path):
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"question": q + "?", "answer": a}) + "\n" for q, a in PROBLEMS[:3]))
    train, test = g.load_problems(tiny_args(tiny_model_dir, jsonl_path, eval_size=2, test_path=str(test_file)))
    assert len(train) == len(PROBLEMS) and [q for q, _ in test] == [q + "?" for q, _ in PROBLEMS[:3]]
    assert [gold for _, gold in test] == ["72", "10", "950"]


# ---------------------------------------------------------------------------------------------
# Learning: a toy verifiable task
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["clip", "vaco"])
def test_reward_rises_on_a_toy_task(tiny_model_dir, loss):
    """Reward 1 when the completion starts with a digit: near chance at first, ≥ 0.9 within 40 steps."""
    args, model, tokenizer, eos_ids = load(tiny_model_dir, loss=loss, num_prompts=4, group_size=8,
                                           num_minibatches=2, max_new_tokens=2, learning_rate=1e-2,
                                           temperature=1.0, tv_threshold=0.05)
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    prompts = [g.build_prompt(tokenizer, q, "Answer with a number.") for q, _ in PROBLEMS[:4]]
    digit_first = lambda text, gold: float(text[:1].isdigit())  # noqa: E731
    generator = torch.Generator().manual_seed(1)
    history = []
    for step in range(1, 41):
        batch = g.generate_batch(model, tokenizer, prompts, [""] * 4, digit_first, args, eos_ids, generator=generator,
                                 version=step)
        stats = g.train_on_batch(model, optimizer, batch, args, step)
        history.append(stats["rewards"].mean().item())
        if len(history) >= 3 and min(history[-3:]) >= 0.9:
            break
    assert sum(history[:2]) / 2 < 0.35, history  # starts near chance
    assert min(history[-3:]) >= 0.9, history


# ---------------------------------------------------------------------------------------------
# The command line: smoke runs, data split, bad input
# ---------------------------------------------------------------------------------------------
def run_script(cwd, *argv):
    return subprocess.run([sys.executable, str(ROOT / "grpo_vaco_gsm8k.py"), *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def tiny_cli(model_dir, dataset_path):
    return ["--model-id", model_dir, "--dataset-path", dataset_path, "--num-steps", "2", "--num-prompts", "2",
            "--group-size", "4", "--num-minibatches", "2", "--max-new-tokens", "8", "--eval-size", "2",
            "--eval-every", "1", "--eval-batch-size", "2", "--num-threads", "1"]


def test_smoke_run_logs_and_saves(tiny_model_dir, jsonl_path, tmp_path):
    result = run_script(tmp_path, *tiny_cli(tiny_model_dir, jsonl_path), "--loss", "vaco", "--save-model",
                        "--save-path", str(tmp_path / "saved"), "--micro-batch-size", "2", "--beta", "0.05",
                        "--save-every", "1", "--mask-truncated-completions", "--scale-rewards", "none",
                        "--epsilon-high", "0.28", "--answer-extraction", "flexible")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stdout and "SPS:" in result.stdout and "accuracy before" in result.stdout
    (run_dir,) = (tmp_path / "runs").glob("gsm8k__*")
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    from transformers import AutoModelForCausalLM

    events = tensorboard_log(run_dir)
    for tag in ("charts/reward_mean", "eval/accuracy", "losses/tv", "losses/filtered_fraction", "losses/clip_fraction",
                "losses/clip_fraction_low", "losses/clip_fraction_high", "losses/filter_on_fraction", "losses/kl",
                "losses/entropy", "lag/tv_minibatch_1", "lag/filter_on_minibatch_1", "lag/clip_fraction_minibatch_1",
                "perf/gen_tokens_per_s", "charts/SPS"):
        assert tag in events.Tags()["scalars"], tag
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0, 1, 2]
    assert "eval/samples/text_summary" in events.Tags()["tensors"]
    # checkpoints every step, and the final model, each with the model's own generation config
    for path in (run_dir / "checkpoint-1", run_dir / "checkpoint-2", tmp_path / "saved"):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert model.config.hidden_size == 64 and (path / "tokenizer.json").exists()
        saved = json.loads((path / "generation_config.json").read_text())
        assert saved["top_k"] == 3 and saved["top_p"] == 0.5 and saved["do_sample"] is True, saved


def test_final_evaluation_on_the_whole_test_split(tiny_model_dir, monkeypatch, tmp_path, capsys):
    """Periodic evaluations use the first --eval-size test problems; the last one uses all of them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(g, "load_problems", lambda args: (PROBLEMS[:3], PROBLEMS[2:]))
    args = tiny_args(tiny_model_dir, None, num_steps=1, eval_size=2, eval_every=0, max_new_tokens=4,
                     answer_extraction="flexible")
    result = g.main(args)
    (run_dir,) = (tmp_path / "runs").glob("gsm8k__*")
    events = tensorboard_log(run_dir)
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0, 1]
    assert [e.value for e in events.Scalars("eval/accuracy_full_test")] == pytest.approx([result["accuracy_full_test"]])
    assert "eval/samples_full_test/text_summary" in events.Tags()["tensors"]
    out = capsys.readouterr().out
    assert out.count("on 2 test problems") == 2 and out.count("on 4 test problems") == 1


def test_samples_markdown_pairs_each_completion_with_its_problem_and_keeps_its_text():
    problems = [("What is 2+2?", "4"), ("Q2", "5"), ("Q3", "6")]
    completions = ["# not a heading\n\\boxed{4}", "", "third"]
    blocks = g.samples_markdown(problems, completions, [1.0, 0.0, 0.5], 2).split("\n\n---\n\n")
    assert len(blocks) == 2  # the first n only
    # each completion under its own problem, gold and reward, indented: Markdown shows it verbatim
    assert blocks[0] == "**What is 2+2?** (gold 4, reward 1)\n\n    # not a heading\n    \\boxed{4}"
    assert blocks[1] == "**Q2** (gold 5, reward 0)\n\n    "  # an empty completion still shows as one


def test_held_out_split(tiny_model_dir, jsonl_path):
    train, test = g.load_problems(tiny_args(tiny_model_dir, jsonl_path, eval_size=2))
    assert len(train) == 4 and len(test) == 2
    # the same test problems for every seed: seeds change training, not what it is scored on
    assert g.load_problems(tiny_args(tiny_model_dir, jsonl_path, eval_size=2, seed=7))[1] == test
    assert not {q for q, _ in train} & {q for q, _ in test}
    assert dict(train + test)[PROBLEMS[2][0]] == "950"  # gold parsed from '#### 950'


def test_an_existing_run_folder_is_never_reused(tiny_model_dir, jsonl_path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = tiny_args(tiny_model_dir, jsonl_path, exp_name="x")
    now = int(time.time())
    for t in range(now, now + 30):  # whatever second the run starts in, its folder exists
        os.makedirs(f"runs/gsm8k__x__{args.loss}_N{args.num_minibatches}_S{args.staleness}__{args.seed}__{t}/keep")
    with pytest.raises(SystemExit) as exit_info:
        g.main(args)
    assert exit_info.value.code == 2 and "already exists: wait a second" in capsys.readouterr().err
    assert len(list((tmp_path / "runs").glob("*/keep"))) == 30


@pytest.fixture
def bad_input(tmp_path, tiny_model_dir, jsonl_path):
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{not json\n")
    no_gold = tmp_path / "nogold.jsonl"
    no_gold.write_text(json.dumps({"question": "q", "answer": "just text"}) + "\n")
    no_answers = tmp_path / "questions.jsonl"
    no_answers.write_text(json.dumps({"question": "q"}) + "\n")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    return {
        "missing dataset": (dict(dataset_path=str(tmp_path / "nope.jsonl")), "dataset file not found"),
        "malformed line": (dict(dataset_path=str(malformed)), "bad.jsonl:2: malformed line"),
        "no #### answer": (dict(dataset_path=str(no_gold)), "nogold.jsonl:1: malformed line"),
        "indivisible batch": (dict(num_prompts=3, group_size=2, num_minibatches=4), "not divisible by --num-minibatches 4"),
        "group of one": (dict(group_size=1), "--group-size must be in [2, inf), got 1"),
        "negative clip": (dict(clip_coef=-0.1), "--clip-coef must be in [0, inf), got -0.1"),
        "dppo delta of 1": (dict(dppo_delta=1.0), "--dppo-delta must be in (0, 1), got 1.0"),
        "unknown model": (dict(model_id=str(tmp_path / "no_such_model")), "cannot load model"),
        "save path exists": (dict(save_model=True, save_path=str(existing)), "already exists"),
        "too few problems": (dict(eval_size=6), "need more than --eval-size 6"),
        "negative staleness": (dict(staleness=-1), "--staleness must be in [0, inf), got -1"),
        "test file without answers": (dict(test_path=str(no_answers)), "questions.jsonl:1: malformed line"),
        "pass@k above the samples": (dict(eval_samples=3, pass_k=4), "--pass-k 4 needs 1 <= k <= --eval-samples (3)"),
        "pass@k without samples": (dict(pass_k=2), "--pass-k 2 needs 1 <= k <= --eval-samples (0)"),
    }


@pytest.mark.parametrize("case", ["missing dataset", "malformed line", "no #### answer", "indivisible batch",
                                  "group of one", "negative clip", "dppo delta of 1", "unknown model",
                                  "save path exists", "too few problems", "negative staleness",
                                  "test file without answers", "pass@k above the samples", "pass@k without samples"])
def test_bad_input_is_one_line_and_exit_2(bad_input, tiny_model_dir, jsonl_path, capsys, case):
    overrides, message = bad_input[case]
    with pytest.raises(SystemExit) as exit_info:
        g.main(replace(tiny_args(tiny_model_dir, jsonl_path), **overrides))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    if case == "save path exists":
        assert os.listdir(overrides["save_path"]) == ["keep.txt"]


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path, tiny_model_dir, jsonl_path):
    result = run_script(tmp_path, *tiny_cli(tiny_model_dir, jsonl_path), "--num-minibatches", "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: the batch (--num-prompts 2 x --group-size 4 = 8 completions) is not divisible by --num-minibatches 3"
    ]


# option -> values outside the interval it takes: every numeric option of Args (inf and nan where it is a float)
INF, NAN = float("inf"), float("nan")
OUT_OF_RANGE = dict(
    seed=[-1, 2**32], num_threads=[-1], save_every=[-1], staleness=[-1], num_steps=[0], num_prompts=[0],
    group_size=[1, 0], num_minibatches=[0], micro_batch_size=[-1], learning_rate=[0.0, -1.0, INF, NAN],
    weight_decay=[-1.0, INF, NAN], max_grad_norm=[0.0, -1.0, INF, NAN], temperature=[0.0, -1.0, INF, NAN],
    max_new_tokens=[0], adv_eps=[0.0, -1.0, INF, NAN], clip_coef=[-0.1, INF, NAN], epsilon_high=[-0.1, INF, NAN],
    tv_threshold=[-0.1, INF, NAN], dppo_delta=[0.0, 1.0, -0.1, NAN], tis_cap=[0.0, -1.0, INF, NAN],
    m2po_bound=[0.0, -1.0, INF, NAN], beta=[-0.1, INF, NAN], format_reward=[-1.0, INF, NAN], eval_every=[-1],
    eval_size=[-1], eval_samples=[-1], pass_k=[0], eval_batch_size=[0], num_logged_samples=[-1])
RANGE_CASES = [(name, value) for name, values in OUT_OF_RANGE.items() for value in values]


def test_every_numeric_option_has_its_bad_cases():
    numeric = {f.name for f in dataclasses.fields(g.Args) if {int, float} & {f.type, *typing.get_args(f.type)}}
    assert numeric == OUT_OF_RANGE.keys() == g.RANGES.keys()


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for loader in ("load_model", "load_problems"):
        monkeypatch.setattr(g, loader, lambda *args, **kwargs: pytest.fail("the model or the data was loaded"))


@pytest.mark.parametrize("name, value", RANGE_CASES, ids=[f"{n}={v}" for n, v in RANGE_CASES])
def test_a_value_out_of_range_is_one_line_before_anything_loads(name, value, nothing_loads, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        g.main(tiny_args(str(tmp_path / "no_model"), str(tmp_path / "no_data.jsonl"), **{name: value}))
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert not out and err.strip().splitlines() == [f"error: --{name.replace('_', '-')} must be in {g.RANGES[name]}, got {value}"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, value", [("max_grad_norm", 1e9), ("temperature", 1e-3), ("clip_coef", 0.0),
                                         ("tv_threshold", 0.0), ("beta", 0.0), ("format_reward", 0.0),
                                         ("num_threads", 0), ("micro_batch_size", 0), ("seed", 2**32 - 1),
                                         ("eval_size", 0), ("eval_every", 0), ("weight_decay", 0.0)])
def test_a_value_in_range_passes_the_checks(name, value, nothing_loads, tmp_path):
    g.validate(tiny_args(str(tmp_path / "no_model"), str(tmp_path / "no_data.jsonl"), **{name: value}))


FROM_THE_COMMAND_LINE = [(("--max-grad-norm", "-1"), "error: --max-grad-norm must be in (0, inf), got -1.0"),
                         (("--adv-eps", "0"), "error: --adv-eps must be in (0, inf), got 0.0"),
                         (("--learning-rate", "inf"), "error: --learning-rate must be in (0, inf), got inf"),
                         (("--seed", "-1"), "error: --seed must be in [0, 4294967295], got -1")]


@pytest.mark.parametrize("flags, message", FROM_THE_COMMAND_LINE, ids=[" ".join(f) for f, _ in FROM_THE_COMMAND_LINE])
def test_a_value_out_of_range_from_the_command_line(flags, message, tmp_path):
    result = run_script(tmp_path, "--model-id", str(tmp_path / "no_model"), "--dataset-path",
                        str(tmp_path / "no_data.jsonl"), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not result.stdout
    assert result.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------
# The CPU study's bookkeeping (benchmark/grpo/study.py): no model, no runs
# ---------------------------------------------------------------------------------------------
def test_grpo_study_grid_rule_and_intervals(tmp_path):
    from benchmark.grpo import study
    from benchmark.grpo.cpu_task import delta_by_rule

    phases = study.grid()
    assert [r.name for r in phases[1][:2]] == ["clip_N8__s1", "clip_N1__s1"]  # δ needs the clip N = 8 runs first
    assert sorted({r.config for p in phases.values() for r in p}) == sorted(study.CONFIGS)
    assert len(phases[1]) + len(phases[2]) == 7 * 3
    # the rule: median TV of the stale minibatches, one significant figure; the neighbours are δ/2 and 2δ
    assert delta_by_rule([0.01, 0.03, 0.047, 0.05, 0.2]) == 0.05 and delta_by_rule([0.0012, 0.0014]) == 0.001
    vaco = study.Run("vaco_half_N8", 2)
    assert "--tv-threshold 0.025 " in vaco.command(0.05) and "--seed 2 " in vaco.command(0.05)
    assert "--tv-threshold DELTA" in vaco.command(None)  # listed before δ is chosen
    clip0 = study.Run("clip0_N8", 1).command(0.05)
    assert "--loss clip --clip-coef 0 " in clip0 and "--num-minibatches 8" in clip0
    # a mean and a 95 % Student-t interval over seeds (benchmark/common.py's, scipy's t): 2 ± t · 1/√3 over 3 seeds,
    # t(0.975, 2 d.o.f.) = 4.30265; over 11 seeds (0 to 10: standard error 1) t(0.975, 10) = 2.22814, not the normal 1.96
    m, (lo, hi) = t_interval([1.0, 2.0, 3.0])
    assert (m, hi - m, m - lo) == pytest.approx((2.0, 4.30265 / 3 ** 0.5, 4.30265 / 3 ** 0.5), rel=1e-6)
    m, (lo, hi) = t_interval(range(11))
    assert (m, hi - m) == pytest.approx((5.0, 2.22814), rel=1e-6)
    m, (lo, hi) = t_interval([0.4])
    assert m == 0.4 and math.isnan(lo) and math.isnan(hi)  # one seed: no interval
    # the report's accuracies: in %, one decimal, the mean alone for one seed
    assert study.fmt_percent_interval([0.3, 0.4, 0.5]) == "40.0 [15.2, 64.8]"
    assert study.fmt_percent_interval([0.4]) == "40.0"
    # a run is finished only with its JSON holding the same command; a changed one goes to stale/
    write_atomic(str(tmp_path / "vaco_half_N8__s2.json"), json.dumps({"command": vaco.command(0.05)}))
    (tmp_path / "vaco_half_N8__s2.csv").write_text("step\n")
    assert read_json(str(tmp_path / "vaco_half_N8__s2.json")) == {"command": vaco.command(0.05)}
    assert read_json(str(tmp_path / "clip_N1__s1.json")) is None
    assert is_finished(vaco.name, vaco.command(0.05), str(tmp_path))
    assert not is_finished(vaco.name, vaco.command(0.1), str(tmp_path))
    assert not is_finished("clip_N1__s1", study.Run("clip_N1", 1).command(None), str(tmp_path))  # no JSON
    move_stale(vaco.name, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "stale")) == ["vaco_half_N8__s2.csv", "vaco_half_N8__s2.json"]


def test_gpu_smoke_checks_report_rounding_at_zero_lag_and_the_delta_rule():
    from benchmark.grpo import gpu_smoke as smoke

    fresh = dict(staleness=0, first_max_abs_log_ratio=0.0, first_tv=0.0)
    results = [dict(fresh, loss="clip", stale_tvs=[0.004, 0.0012, 0.03]),
               dict(fresh, loss="vaco", stale_tvs=[1.0], first_max_abs_log_ratio=0.02, first_tv=0.003),
               dict(fresh, loss="vaco S4", staleness=4, stale_tvs=[], first_max_abs_log_ratio=5.0, first_tv=1.0)]
    checks = smoke.assumption_checks(results, default_delta=0.005)
    # the largest over the runs without staleness (a stale run's minibatch 0 carries the backward lag)
    assert checks["zero_lag_max_abs_log_ratio"] == 0.02 and checks["zero_lag_tv"] == 0.003
    assert checks["tv_calibration"] == dict(loss="clip", stale_minibatches=3, median_tv=0.004, delta=0.004,
                                            default_delta=0.005)  # the clip run's only: the filter does not act
    assert "median TV 0.004, so δ = 0.004, against the script's default 0.005" in smoke.checks_markdown(checks)
    assert smoke.round_to_one_figure(0.0049) == 0.005 and smoke.round_to_one_figure(0.041) == 0.04


@pytest.mark.floatfree
def test_gpu_smoke_command_on_the_cpu(tmp_path):
    """benchmark/grpo/gpu_smoke.py with a tiny random model on the CPU: one step of each loss at N = 8 and
    of vaco at S = 4, its table and JSON in --out-dir, and the time budget that stops it starting another run;
    then three steps at S = 2, where the backward lag shows from the second step on."""
    smoke = [sys.executable, str(ROOT / "benchmark" / "grpo" / "gpu_smoke.py"), "--tiny", "--device", "cpu",
             "--num-steps", "1", "--extra", "--num-threads 1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    result = subprocess.run(smoke + ["--out-dir", str(tmp_path / "all")], capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "all" / "grpo_gpu_smoke.json").read_text())
    rows = {r["loss"]: r for r in saved["results"]}
    assert list(rows) == ["clip", "vaco", "dppo-tv", "vaco S4"] and saved["skipped"] == []
    assert [r["staleness"] for r in rows.values()] == [0, 0, 0, 4]
    for r in rows.values():
        assert r["tv_backward"] == [0.0]  # one step: the batch of the initial policy, age 0
        assert r["steps"] == 1 and r["peak_memory_gib"] > 0 and r["gen_tokens_per_s"] > 0 and r["train_tokens_per_s"] > 0
        assert len(r["tv"]) == 8 and r["tv"][0] == 0 and all(tv > 0 for tv in r["tv"][1:])  # lag from k = 1 on
        assert r["completion_length"] == 8  # a random model does not stop: every completion is full length
    # minibatch 0 has ρ = 1, where the three losses give the same update: the same TV at k = 1
    assert rows["clip"]["tv"][1] == pytest.approx(rows["vaco"]["tv"][1], rel=1e-5)
    assert rows["clip"]["tv"][1] == pytest.approx(rows["dppo-tv"]["tv"][1], rel=1e-5)
    assert rows["vaco"]["filtered"] > 0 and rows["vaco"]["tv"][2:] != rows["clip"]["tv"][2:]  # the filter acted
    table = (tmp_path / "all" / "grpo_gpu_smoke.md").read_text()
    assert table.count("\n| clip | 0 |") == table.count("\n| vaco | 0 |") == table.count("\n| vaco S4 | 4 |") == 1
    # on the CPU in fp32 the training pass reproduces μ's log-probs exactly: ρ = 1 at zero lag, no warning
    assert saved["zero_lag_max_abs_log_ratio"] == 0.0 and saved["zero_lag_tv"] == 0.0
    assert "warning: at zero lag" not in result.stdout
    calibration = saved["tv_calibration"]  # the δ rule on the clip run's 7 stale minibatches
    assert calibration["stale_minibatches"] == 7 and calibration["default_delta"] == 0.005
    assert calibration["median_tv"] == pytest.approx(sorted(rows["clip"]["tv"][1:])[3])  # one step: its own TVs
    assert calibration["delta"] == float(f"{calibration['median_tv']:.0e}") > 0
    assert "What the first run on this hardware must check" in table
    # a budget already spent: the first loss runs, the others are reported as not run
    result = subprocess.run(smoke + ["--out-dir", str(tmp_path / "cut"), "--time-budget", "0"], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "cut" / "grpo_gpu_smoke.json").read_text())
    assert [r["loss"] for r in saved["results"]] == ["clip"] and saved["skipped"] == ["vaco", "dppo-tv", "vaco S4"]
    assert "Not run (time budget): vaco, dppo-tv, vaco S4." in (tmp_path / "cut" / "grpo_gpu_smoke.md").read_text()
    # S = 2 over three steps (ages 0, 1, 2): backward TV 0 at the first step, > 0 from the second on
    smoke[smoke.index("--num-steps") + 1] = "3"
    result = subprocess.run(smoke + ["--out-dir", str(tmp_path / "stale"), "--losses", "clip", "--staleness", "2",
                                     "--stale-loss", "decoupled"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (clip, stale) = json.loads((tmp_path / "stale" / "grpo_gpu_smoke.json").read_text())["results"]
    assert stale["loss"] == "decoupled S2" and stale["steps"] == 3 and clip["tv_backward"] == [0.0] * 3
    assert stale["tv_backward"][0] == 0 and all(tv > 0 for tv in stale["tv_backward"][1:])
