"""Tests for grpo_vaco_gsm8k.py. No downloads: a tiny random Qwen2 model and a byte-level BPE
tokenizer are built here, saved to a temporary folder and loaded through the script's own path."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import grpo_vaco_gsm8k as g  # noqa: E402

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
    model, tokenizer, eos_ids = g.load_model(args, torch.device("cpu"), torch.float32)
    return args, model, tokenizer, eos_ids


# ---------------------------------------------------------------------------------------------
# Answer extraction and reward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{18}.", "18"),
    ("first \\boxed{3} then \\boxed{7}", "7"),                        # the last box wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),                         # nested braces
    ("\\boxed{\\$1,234.}", "1234"),                                    # $, commas, trailing dot
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("The total is \\boxed{18.50}", "18.50"),
    ("\\boxed{-5}", "-5"),
    ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),     # GSM8k gold format
    ("#### $1,000.", "1000"),
    ("She has 3 apples, then 5, so 8.", "8"),                          # last number
    ("It costs $2,500.", "2500"),
    ("no number here", None),
    ("", None),
    ("unclosed \\boxed{12 and then 13", "13"),                        # truncated box: fall back
])
def test_extract_answer(text, expected):
    assert g.extract_answer(text) == expected


@pytest.mark.parametrize("completion, gold, reward", [
    ("\\boxed{72}", "...\n#### 72", 1.0),
    ("\\boxed{18.5}", "18.50", 1.0),                                  # numerically equal
    ("\\boxed{18.50}", "#### 18.5", 1.0),
    ("The answer is 1,200", "#### 1200", 1.0),
    ("\\boxed{71}", "#### 72", 0.0),
    ("garbage }}{{ \\boxed{", "#### 72", 0.0),                        # malformed: 0, no crash
    ("", "#### 72", 0.0),
    ("\\boxed{abc}", "#### 72", 0.0),
])
def test_gsm8k_reward(completion, gold, reward):
    assert g.gsm8k_reward(completion, gold) == reward


def test_format_reward_is_opt_in():
    assert g.gsm8k_reward("\\boxed{5}", "#### 72", format_reward=0.1) == pytest.approx(0.1)
    assert g.gsm8k_reward("\\boxed{72}", "#### 72", format_reward=0.1) == pytest.approx(1.1)
    assert g.gsm8k_reward("72", "#### 72", format_reward=0.1) == 1.0  # correct but not boxed


def test_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = g.group_advantages(rewards, 4, eps=0.0 + 1e-4)
    std = torch.tensor([1.0, 0, 0, 0]).std().item()  # Bessel-corrected std of one group
    expected_first = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-4)
    assert torch.allclose(adv[:4], expected_first, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(8))  # all-equal groups carry no signal, and no NaN
    assert abs(adv[:4].sum().item()) < 1e-6


# ---------------------------------------------------------------------------------------------
# The losses
# ---------------------------------------------------------------------------------------------
def _loss_inputs():
    ratios = torch.tensor([[1.5, 0.5, 1.15, 9.0], [0.85, 1.1, 1.0, 0.1]])
    behavior = torch.log(torch.tensor([[0.2, 0.4, 0.5, 0.3], [0.5, 0.5, 0.1, 0.9]]))
    new = (behavior + torch.log(ratios)).requires_grad_(True)
    advantages = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # the last column is padding
    return ratios, behavior, new, advantages, mask


def test_vaco_token_loss_filters_tokens_that_move_away():
    ratios, behavior, new, advantages, mask = _loss_inputs()
    loss, tv, filtered = g.vaco_token_loss(new, behavior, advantages, mask, tv_threshold=0.1)
    # tv = ½ mean |ρ-1| over the 6 valid tokens: ½ (0.5+0.5+0.15+0.15+0.1+0) / 6; padding ignored
    assert tv.item() == pytest.approx(0.5 * 1.4 / 6)
    # A>0 with ρ>1 (1.5, 1.15) and A<0 with ρ<1 (0.85) move away from μ: filtered. ρ=1 is not.
    assert filtered.item() == pytest.approx(3 / 6)
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
    _, behavior, new, advantages, mask = _loss_inputs()
    loss, tv, filtered = g.vaco_token_loss(new, behavior, advantages, mask, tv_threshold=0.2)
    assert tv.item() < 0.2 and filtered.item() == 0
    loss.backward()
    assert (new.grad[:, :3] != 0).all() and (new.grad[:, 3] == 0).all()


def test_losses_ignore_padding_values():
    ratios, behavior, new, advantages, mask = _loss_inputs()
    other = new.detach().clone()
    other[:, 3] = 123.0  # change what sits under the padding
    for fn in (lambda n: g.vaco_token_loss(n, behavior, advantages, mask, 0.1),
               lambda n: g.clip_token_loss(n, behavior, advantages, mask, 0.2)):
        first, second = fn(new.detach()), fn(other)
        assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_clip_token_loss():
    ratios, behavior, new, advantages, mask = _loss_inputs()
    loss, clip_fraction = g.clip_token_loss(new, behavior, advantages, mask, clip_coef=0.2)
    # A=+1: min(ρ, clip(ρ)) -> 1.2, 0.5, 1.15; A=-2: min(-2ρ, -2clip(ρ)) -> -2*0.85, -2*1.1, -2*1.0
    expected = -(1.2 + 0.5 + 1.15 - 2 * (0.85 + 1.1 + 1.0)) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert clip_fraction.item() == pytest.approx(2 / 6)  # 1.5 and 0.5 are outside [0.8, 1.2]; padding does not count
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0


def test_k3_kl_is_zero_at_equality_and_positive_otherwise():
    a = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(g.k3_kl(a, a), torch.zeros(3))
    assert (g.k3_kl(a, a + torch.tensor([0.3, -0.3, 1.0])) > 0).all()


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


def _step(model_dir, seed=0, **overrides):
    """One grpo_step on the tiny model with a plain SGD optimiser; returns (model, stats)."""
    args, model, tokenizer, eos_ids = load(model_dir, **overrides)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    prompts = [g.build_prompt(tokenizer, q, "") for q, _ in PROBLEMS[:2]]
    torch.manual_seed(seed)
    stats = g.grpo_step(model, optimizer, tokenizer, prompts, ["1", "2"], lambda text, gold: float(len(text) % 2),
                        args, eos_ids, generator=torch.Generator().manual_seed(seed))
    return model, stats


@pytest.mark.parametrize("loss", ["clip", "vaco"])
def test_micro_batching_gives_the_one_batch_gradient_and_zero_lag_ratio_is_one(tiny_model_dir, loss):
    # N = 2 minibatches of 4; a big SGD step so that minibatch 1 sees real lag; δ tiny so VACO filters
    common = dict(loss=loss, num_minibatches=2, group_size=4, learning_rate=3.0, tv_threshold=1e-6,
                  max_new_tokens=6, max_grad_norm=1e9)
    one_batch, stats = _step(tiny_model_dir, micro_batch_size=0, **common)
    micro, micro_stats = _step(tiny_model_dir, micro_batch_size=1, **common)
    mb = stats["per_minibatch"]
    # minibatch 0 is trained by the policy that generated it: ρ = 1 exactly, no TV, nothing filtered
    assert mb["tv"][0] < 1e-6 and abs(mb["ratio_min"][0] - 1) < 1e-5 and abs(mb["ratio_max"][0] - 1) < 1e-5
    assert mb["filtered_fraction"][0] == 0
    # minibatch 1 is one optimiser step late: the lag shows, and VACO's filter acts
    assert mb["tv"][1] > 1e-3
    if loss == "vaco":
        assert mb["filtered_fraction"][1] > 0
    assert stats["completions"] == micro_stats["completions"]
    for a, b in zip(one_batch.parameters(), micro.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert mb["tv"] == pytest.approx(micro_stats["per_minibatch"]["tv"], rel=1e-4, abs=1e-6)
    assert mb["filtered_fraction"] == pytest.approx(micro_stats["per_minibatch"]["filtered_fraction"], abs=1e-6)


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
    for _ in range(40):
        stats = g.grpo_step(model, optimizer, tokenizer, prompts, [""] * 4, digit_first, args, eos_ids,
                            generator=generator)
        history.append(stats["reward_mean"])
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


@pytest.mark.parametrize("loss, extra", [("clip", []), ("vaco", ["--micro-batch-size", "2", "--beta", "0.05"])])
def test_smoke_run_logs_and_saves(tiny_model_dir, jsonl_path, tmp_path, loss, extra):
    result = run_script(tmp_path, *tiny_cli(tiny_model_dir, jsonl_path), "--loss", loss, "--save-model",
                        "--save-path", str(tmp_path / "saved"), *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stdout and "SPS:" in result.stdout and "accuracy before" in result.stdout
    assert len(list((tmp_path / "runs").glob("*/events.out.tfevents.*"))) == 1
    from transformers import AutoModelForCausalLM
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((tmp_path / "runs").glob("gsm8k__*")))).Reload()
    for tag in ("charts/reward_mean", "eval/accuracy", "losses/tv", "losses/filtered_fraction", "losses/clip_fraction",
                "losses/entropy", "lag/tv_minibatch_1", "perf/gen_tokens_per_s", "charts/SPS"):
        assert tag in events.Tags()["scalars"], tag
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0, 1, 2]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert model.config.hidden_size == 64 and (tmp_path / "saved" / "tokenizer.json").exists()


def test_held_out_split(tiny_model_dir, jsonl_path):
    train, test = g.load_problems(tiny_args(tiny_model_dir, jsonl_path, eval_size=2))
    assert len(train) == 4 and len(test) == 2
    assert not {q for q, _ in train} & {q for q, _ in test}
    assert dict(train + test)[PROBLEMS[2][0]] == "950"  # gold parsed from '#### 950'


@pytest.fixture
def bad_input(tmp_path, tiny_model_dir, jsonl_path):
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{not json\n")
    no_gold = tmp_path / "nogold.jsonl"
    no_gold.write_text(json.dumps({"question": "q", "answer": "just text"}) + "\n")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    return {
        "missing dataset": (dict(dataset_path=str(tmp_path / "nope.jsonl")), "dataset file not found"),
        "malformed line": (dict(dataset_path=str(malformed)), "bad.jsonl:2: malformed line"),
        "no #### answer": (dict(dataset_path=str(no_gold)), "nogold.jsonl:1: malformed line"),
        "indivisible batch": (dict(num_prompts=3, group_size=2, num_minibatches=4), "not divisible by --num-minibatches 4"),
        "group of one": (dict(group_size=1), "--group-size must be at least 2"),
        "unknown model": (dict(model_id=str(tmp_path / "no_such_model")), "cannot load model"),
        "save path exists": (dict(save_model=True, save_path=str(existing)), "already exists"),
        "too few problems": (dict(eval_size=6), "need more than --eval-size 6"),
    }


@pytest.mark.parametrize("case", ["missing dataset", "malformed line", "no #### answer", "indivisible batch",
                                  "group of one", "unknown model", "save path exists", "too few problems"])
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
