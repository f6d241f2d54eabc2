"""Decoupled PPO (`decoupled_ppo_continuous.py`): its loss and gradient on a worked
example, and its runs: PPO's bit for bit without lag, its own under lag."""

import math

import numpy as np
import pytest
import torch

import decoupled_ppo_continuous as decoupled
import ppo_continuous as ppo

# Four samples, eps = 0.2. Per sample: the advantage A, w = pi_T/beta, r = pi_theta/pi_T.
#   1: A = +1, w = 2,   r = 1.1: inside the clip            -> w r A = 2.2,          dL/dlog pi = -w r A / 4 = -0.55
#   2: A = +1, w = 0.5, r = 1.5: above 1 + eps, A > 0: clipped -> w (1 + eps) A = 0.6, no gradient
#   3: A = -2, w = 1,   r = 0.5: below 1 - eps, A < 0: clipped -> w (1 - eps) A = -1.6, no gradient
#   4: A = -1, w = 200, r = 1.5: above 1 + eps, A < 0: min keeps r A; w capped at 100
#                                                              -> 100 r A = -150,   dL/dlog pi = -100 r A / 4 = 37.5
# L = -(2.2 + 0.6 - 1.6 - 150) / 4 = 37.2
ADVANTAGES = [1.0, 1.0, -2.0, -1.0]
WEIGHTS = [2.0, 0.5, 1.0, 200.0]
RATIOS = [1.1, 1.5, 0.5, 1.5]


def worked_example():
    behaviour = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    proximal = behaviour + torch.tensor(WEIGHTS).log()
    newlogprob = (proximal + torch.tensor(RATIOS).log()).requires_grad_()
    return newlogprob, behaviour, proximal, torch.tensor(ADVANTAGES)


def test_worked_example_loss_and_gradient():
    newlogprob, behaviour, proximal, advantages = worked_example()
    loss, rho, r = decoupled.decoupled_policy_loss(newlogprob, behaviour, proximal, advantages, clip_coef=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(37.2, rel=1e-6)
    np.testing.assert_allclose(newlogprob.grad.numpy(), [-0.55, 0.0, 0.0, 37.5], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(r.detach().numpy(), RATIOS, rtol=1e-6)  # the ratio the clip acts on
    np.testing.assert_allclose(rho.detach().numpy(), np.multiply(WEIGHTS, RATIOS), rtol=1e-6)  # pi_theta/beta


def test_a_weight_too_large_for_float32_is_capped_without_a_nan_gradient():
    # pi_T/beta = e^94 overflows float32: the capped weight 100 must still give finite, exact gradients
    behaviour, proximal = torch.tensor([-95.0, -1.0]), torch.tensor([-1.0, -1.0])
    newlogprob = proximal.clone().requires_grad_()  # r = 1: inside the clip
    loss, _, _ = decoupled.decoupled_policy_loss(newlogprob, behaviour, proximal, torch.tensor([1.0, 1.0]), 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-(100.0 + 1.0) / 2)
    assert newlogprob.grad.tolist() == pytest.approx([-50.0, -0.5])


def test_ppo_clips_away_the_stale_sample_that_decoupled_ppo_keeps():
    # sample 1 is stale: pi_theta/beta = 2.2 is far above PPO's clip, so PPO gives it no gradient,
    # while decoupled PPO, whose r = 1.1 is inside the clip, follows it with weight w = 2
    newlogprob, behaviour, _, advantages = worked_example()
    loss, _ = ppo.ppo_policy_loss(newlogprob, behaviour, advantages, clip_coef=0.2)
    loss.backward()
    assert newlogprob.grad[0].item() == 0.0


def test_without_lag_it_is_ppo_s_loss_and_gradient():
    # pi_T = beta: w = 1 exactly and r is PPO's ratio, so loss and gradient are PPO's to the bit
    g = torch.Generator().manual_seed(0)
    behaviour, advantages = torch.randn(64, generator=g), torch.randn(64, generator=g)
    shift = 0.3 * torch.randn(64, generator=g)
    results = []
    for is_decoupled in (False, True):
        newlogprob = (behaviour + shift).requires_grad_()
        if is_decoupled:
            loss = decoupled.decoupled_policy_loss(newlogprob, behaviour, behaviour, advantages, 0.2)[0]
        else:
            loss = ppo.ppo_policy_loss(newlogprob, behaviour, advantages, 0.2)[0]
        loss.backward()
        results.append((loss, newlogprob.grad))
    (ppo_loss, ppo_grad), (decoupled_loss, decoupled_grad) = results
    assert decoupled_loss.item() == ppo_loss.item()
    assert torch.equal(decoupled_grad, ppo_grad) and (ppo_grad == 0).any() and (ppo_grad != 0).any()


COMPARED = ["charts/episodic_return", "losses/value_loss", "losses/entropy",
            "losses/approx_kl", "losses/clipfrac", "losses/tv_divergence", "losses/explained_variance"]


def test_at_k1_it_trains_as_ppo_bit_for_bit(train):
    settings = dict(total_timesteps=512, learning_rate=3e-3)  # 4 updates with large steps: the clip acts
    _, reference = train(ppo, exp_name="ppo", **settings)
    _, run = train(decoupled, exp_name="decoupled", **settings)
    assert max(reference["losses/clipfrac"]) > 0
    # w = pi_T/beta is 1 only up to rounding here (the learner evaluates the whole batch at once, the
    # actors one step at a time), and still the gradient, so the run, is PPO's to the bit
    assert max(reference["charts/backward_ratio_max"]) < 1 + 1e-5
    for tag in COMPARED:
        assert run[tag] == reference[tag], tag
    # the loss's value differs by rounding at most, where the clip binds (its constant is w clip(r) A)
    np.testing.assert_allclose(run["losses/policy_loss"], reference["losses/policy_loss"], rtol=1e-5)


def test_under_lag_it_trains_its_own_way(train):
    settings = dict(total_timesteps=512, learning_rate=3e-3, policy_buffer=4)
    _, reference = train(ppo, exp_name="ppo", **settings)
    _, run = train(decoupled, exp_name="decoupled", **settings)
    # the first update has no stale snapshot yet: the same (w = 1 to rounding, as at K = 1); later ones differ
    np.testing.assert_allclose(run["losses/policy_loss"][0], reference["losses/policy_loss"][0], rtol=1e-5)
    assert not np.allclose(run["losses/policy_loss"][1:], reference["losses/policy_loss"][1:], rtol=1e-3)
    weights_mean, weights_max = run["charts/backward_ratio_mean"], run["charts/backward_ratio_max"]
    # w is 1 (to rounding) in a batch whose actors all drew the current policy, away from 1 with a stale one
    stale = [lag > 0 for lag in run["charts/policy_lag_max"]]
    assert not stale[0] and any(stale)
    assert all(top > 1.01 if lag else top == pytest.approx(1.0, abs=1e-5) for top, lag in zip(weights_max, stale))
    assert all(0 < mean <= top for mean, top in zip(weights_mean, weights_max))
    assert all(math.isfinite(v) and 0 <= v <= 1 for v in run["losses/clipfrac"])
