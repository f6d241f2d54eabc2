"""SPO's policy objective (spo_continuous.py): a parabola in the ratio that peaks at 1 + sign(A) eps."""

import numpy as np
import pytest
import torch

import spo_continuous as spo


@pytest.mark.parametrize("advantage", [2.0, -0.5])
@pytest.mark.parametrize("epsilon", [0.2, 0.1])
def test_objective_peaks_at_one_plus_sign_a_epsilon(advantage, epsilon):
    ratios = torch.linspace(0.5, 1.5, 100_001)
    objective = -torch.stack([spo.spo_policy_loss(r.log().reshape(1), torch.zeros(1), torch.tensor([advantage]),
                                                   epsilon)[0] for r in ratios[::1000]])
    peak = 1 + np.sign(advantage) * epsilon
    assert ratios[::1000][objective.argmax()].item() == pytest.approx(peak, abs=0.01)
    # the gradient with respect to the ratio vanishes at the peak, and points towards it elsewhere
    for r, sign in [(peak, 0.0), (peak - 0.05, 1.0), (peak + 0.05, -1.0)]:
        ratio = torch.tensor([r], requires_grad=True)
        loss, _ = spo.spo_policy_loss(ratio.log(), torch.zeros(1), torch.tensor([advantage]), epsilon)
        (-loss).backward()
        assert ratio.grad.item() == pytest.approx(0.0, abs=1e-6) if sign == 0 else np.sign(ratio.grad.item()) == sign


def test_loss_value_and_mean_over_samples():
    newlogprob = torch.tensor([1.3, 0.8, 1.0]).log()
    advantages = torch.tensor([1.0, -2.0, 0.5])
    loss, ratio = spo.spo_policy_loss(newlogprob, torch.zeros(3), advantages, 0.2)
    # -(r A - |A| (r - 1)^2 / (2 eps)), averaged
    expected = -np.mean([1.3 - 0.09 / 0.4, -1.6 - 2 * 0.04 / 0.4, 0.5])
    assert loss.item() == pytest.approx(expected)
    torch.testing.assert_close(ratio, torch.tensor([1.3, 0.8, 1.0]))


def test_spo_runs_and_logs(train):
    _, scalars = train(spo, policy_buffer=2, total_timesteps=256)
    assert len(scalars["losses/policy_loss"]) == 2 and np.isfinite(scalars["losses/approx_kl"]).all()
    assert all(0.0 <= c <= 1.0 for c in scalars["losses/clipfrac"])


def test_bad_epsilon(train):
    with pytest.raises(SystemExit, match="error: --epsilon must be positive"):
        train(spo, epsilon=0.0)
