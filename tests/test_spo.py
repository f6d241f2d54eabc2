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


@pytest.mark.parametrize("ratio, advantage, objective, slope", [
    # f(r) = r A - |A| (r - 1)^2 / (2 eps) and its slope r f'(r) = r (A - |A| (r - 1) / eps) per log r
    (1.0, 2.0, 2.0, 2.0),  # at r = 1: the policy gradient's r A, pushed as hard as PPO's
    (1.2, 2.0, 2.2, 0.0),  # at the peak 1 + eps: no push
    (1.5, 2.0, 1.75, -4.5),  # beyond it: pulled back (PPO's clipped surrogate gives 0 here)
    (0.8, 2.0, 1.4, 3.2),  # below 1 with A > 0: pushed up, harder than at r = 1
    (0.8, -1.0, -0.9, 0.0),  # the peak of a negative advantage, 1 - eps
    (0.5, -1.0, -1.125, 0.75),  # beyond it: pulled back up
])
def test_worked_example_value_and_gradient(ratio, advantage, objective, slope):
    newlogprob = torch.tensor([np.log(ratio)], requires_grad=True)
    loss, _ = spo.spo_policy_loss(newlogprob, torch.zeros(1), torch.tensor([advantage]), 0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-objective, abs=1e-6)
    assert newlogprob.grad.item() == pytest.approx(-slope, abs=1e-6)


def test_bad_epsilon(train):
    with pytest.raises(SystemExit, match=r"error: --epsilon must be in \(0, inf\), got 0.0"):
        train(spo, epsilon=0.0)
