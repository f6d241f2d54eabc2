"""The scripts differ only where they say they do. Each comparison trains two scripts (or two
settings) with the same seed and checks that they agree exactly where they claim to, and that the
comparison would see a difference (so it can fail)."""

import difflib
import inspect
import os

import numpy as np
import pytest
import torch

import geppo_continuous as geppo
import ppo_continuous as ppo
import spo_continuous as spo
import vaco_async
import vaco_continuous as vaco
from conftest import ROOT

# a few updates with lag and large steps, so that stale snapshots, V-trace's ratios and PPO's clip all act
FEW_UPDATES = dict(total_timesteps=512, policy_buffer=4, learning_rate=3e-3)
# what every script logs: the rollout (episodes, lag) and the update (losses)
SHARED = ["charts/episodic_return", "charts/episodic_length", "charts/policy_lag_mean", "charts/backward_tv",
          "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
          "losses/tv_divergence", "losses/explained_variance"]


def assert_same_run(a, b):
    for tag in SHARED:
        assert len(a[tag]) > 0 and a[tag] == b[tag], tag


def test_vaco_without_its_method_is_ppo(train):
    # both components off and PPO's value-loss clipping: PPO, bit for bit
    _, reference = train(ppo, exp_name="ppo", **FEW_UPDATES)
    _, none = train(vaco, exp_name="none", advantage_alignment=False, tv_filter=False, clip_vloss=True, **FEW_UPDATES)
    assert_same_run(reference, none)
    assert max(reference["losses/clipfrac"]) > 0 and max(reference["charts/backward_tv"]) > 0  # clip and lag acted
    # VACO's own value loss (no clipping) is the one difference left; the comparison sees it
    _, unclipped = train(vaco, exp_name="unclipped", advantage_alignment=False, tv_filter=False, **FEW_UPDATES)
    assert unclipped["losses/value_loss"] != reference["losses/value_loss"]


def test_vtrace_with_the_decoupled_clip_is_decoupled_ppo_but_for_its_advantages(train):
    # VACO's ablation with decoupled PPO's clip: without V-trace, and with PPO's value-loss clipping, it is
    # decoupled PPO bit for bit; with V-trace (the option's purpose) the same trust region on other advantages
    _, decoupled = train(ppo, exp_name="decoupled", clip_reference="proximal", **FEW_UPDATES)
    common = dict(tv_filter=False, clip_reference="proximal", clip_vloss=True, **FEW_UPDATES)
    _, gae = train(vaco, exp_name="gae", advantage_alignment=False, **common)
    _, vtrace = train(vaco, exp_name="vtrace", **common)
    assert_same_run(decoupled, gae)
    assert max(decoupled["losses/clipfrac"]) > 0
    assert vtrace["losses/policy_loss"][1:] != decoupled["losses/policy_loss"][1:]
    assert vtrace["charts/episodic_return"][:3] == decoupled["charts/episodic_return"][:3]  # the same first rollout


def test_each_vaco_component_changes_the_run(train):
    _, none = train(vaco, exp_name="none", advantage_alignment=False, tv_filter=False, **FEW_UPDATES)
    _, align = train(vaco, exp_name="align", tv_filter=False, **FEW_UPDATES)
    _, filtered = train(vaco, exp_name="filter", advantage_alignment=False, tv_threshold=0.01, **FEW_UPDATES)
    # the rollout of the first update is the same in all three: the components act only on learning
    assert none["charts/episodic_return"][0] == align["charts/episodic_return"][0] == filtered["charts/episodic_return"][0]
    assert align["losses/value_loss"] != none["losses/value_loss"]  # V-trace targets differ from GAE's under lag
    assert max(filtered["losses/filtered_fraction"]) > 0
    assert filtered["losses/policy_loss"] != none["losses/policy_loss"]


def test_spo_is_ppo_but_for_the_policy_loss(train, monkeypatch):
    # with PPO's clipped surrogate in place of SPO's objective, the SPO script trains exactly as PPO
    _, reference = train(ppo, exp_name="ppo", **FEW_UPDATES)
    spo_policy_loss = spo.spo_policy_loss
    monkeypatch.setattr(spo, "spo_policy_loss", lambda newlogprob, behaviour_logprobs, advantages, epsilon:
                        ppo.ppo_policy_loss(newlogprob, behaviour_logprobs, advantages, epsilon))
    _, swapped = train(spo, exp_name="swapped", **FEW_UPDATES)
    assert_same_run(reference, swapped)
    monkeypatch.setattr(spo, "spo_policy_loss", spo_policy_loss)  # not undo(): that would leave the run's folder too
    _, own = train(spo, exp_name="spo", **FEW_UPDATES)
    assert own["losses/policy_loss"] != reference["losses/policy_loss"]


def test_spo_and_ppo_agree_where_both_ratios_are_one(train):
    # One epoch of one minibatch at K = 1: every update is a single step from r = 1, where SPO's
    # gradient, (A - |A| (r - 1) / eps) dr, equals PPO's, A dr. r is 1 only up to float rounding (the
    # actors' forward pass runs on the envs, the learner's on the whole batch), so within a tolerance.
    settings = dict(total_timesteps=512, num_minibatches=1, update_epochs=1)
    _, a = train(ppo, exp_name="ppo", **settings)
    _, b = train(spo, exp_name="spo", **settings)
    for tag in ["charts/episodic_return", "losses/policy_loss", "losses/value_loss", "losses/entropy"]:
        np.testing.assert_allclose(a[tag], b[tag], rtol=1e-4, atol=1e-6, err_msg=tag)
    # several minibatches: ratios leave 1 and the two objectives part
    _, c = train(ppo, exp_name="ppo4", total_timesteps=512)
    _, d = train(spo, exp_name="spo4", total_timesteps=512)
    assert not np.allclose(c["losses/policy_loss"], d["losses/policy_loss"], rtol=1e-3)


@pytest.mark.parametrize("ratio", [1.0, 1.1, 0.9])
def test_spo_and_ppo_policy_losses_near_one(ratio):
    # inside the trust region both objectives equal r A at r = 1, with the same gradient; away
    # from 1 SPO's penalty |A| (r - 1)^2 / (2 eps) is the only difference
    advantages = torch.tensor([1.5, -0.5])
    grads = []
    for loss_fn in (ppo.ppo_policy_loss, spo.spo_policy_loss):
        newlogprob = torch.full((2,), float(np.log(ratio)), requires_grad=True)
        loss, _ = loss_fn(newlogprob, torch.zeros(2), advantages, 0.2)
        loss.backward()
        grads.append((loss.item(), newlogprob.grad.clone()))
    (ppo_loss, ppo_grad), (spo_loss, spo_grad) = grads
    penalty = (advantages.abs() * (ratio - 1) ** 2 / 0.4).mean().item()
    assert spo_loss == pytest.approx(ppo_loss + penalty, abs=1e-7)
    if ratio == 1.0:
        torch.testing.assert_close(spo_grad, ppo_grad, rtol=0, atol=0)


def changed_lines(a, b):
    with open(os.path.join(ROOT, a)) as f, open(os.path.join(ROOT, b)) as g:
        diff = difflib.unified_diff(f.read().splitlines(), g.read().splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize("base, other, limit", [("ppo_continuous.py", "vaco_continuous.py", 200),
                                               ("ppo_continuous.py", "spo_continuous.py", 130),
                                               ("vaco_continuous.py", "geppo_continuous.py", 250)])
def test_diff_stays_the_method(base, other, limit):
    # what a reader checks with `diff ppo_continuous.py <other>` (and `diff vaco_continuous.py geppo_continuous.py`,
    # the sibling that shares VACO's V-trace): the method (and PPO's own options: PPO-KL, decoupled PPO, the stale
    # samples left out), not a second pipeline
    lines = changed_lines(base, other)
    assert 0 < len(lines) <= limit, f"{len(lines)} changed lines"


# what each script changes of ppo_continuous.py: its options, their checks, and the method (and, in
# vaco_async.py, the machinery of actor processes: their envs, rollouts and reward statistics, and what
# its checkpoints hold: each actor's noise generator instead of the simulated lag's state)
# (ppo_continuous.py's own options: decoupled PPO, its decoupled_policy_loss; and --max-policy-lag, in its
# minibatch_loss; vaco_async.py has no --max-update-kl, and so no gaussian_kl and update_kl)
METHOD = {spo: {"Args", "check_args", "ppo_policy_loss", "decoupled_policy_loss", "minibatch_loss"},
          vaco: {"Args", "check_args", "estimate_advantages", "minibatch_loss", "main"},
          vaco_async: {"Args", "check_args", "estimate_advantages", "minibatch_loss", "main",
                       "make_envs", "RewardScaler", "PolicyBuffer", "collect_rollout", "checkpoint_of", "resume",
                       "gaussian_kl", "update_kl"},
          # GePPO: VACO's V-trace, its own trust region (the loss, the band's normalisation), the actor's own rate
          # (train_step), the learning-rate rule, and the rule's factor in its checkpoints
          geppo: {"Args", "check_args", "estimate_advantages", "ppo_policy_loss", "decoupled_policy_loss",
                  "minibatch_loss", "train_step", "main", "checkpoint_of", "resume"}}


@pytest.mark.parametrize("other", [spo, vaco, vaco_async, geppo], ids=lambda m: m.__name__)
def test_everything_but_the_method_is_ppo_s_own_code(other):
    # so a test of the shared pipeline (logging, video, checkpoints) on one script holds for all three
    defined = {name: obj for name, obj in vars(ppo).items()
               if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == ppo.__name__}
    assert METHOD[other] < defined.keys()
    differ = {name for name, obj in defined.items()
              if inspect.getsource(obj) != inspect.getsource(getattr(other, name, lambda: None))}
    assert differ <= METHOD[other], f"{other.__name__} changes {sorted(differ - METHOD[other])}"
