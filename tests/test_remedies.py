"""Remedies for lag: --max-update-kl (every MuJoCo script but vaco_async.py), which stops an update once the exact KL
from pi_T passes it, and ppo_continuous.py's --max-policy-lag, which leaves the stale samples out of the policy loss.
Their formulas on hand-made tensors, and what they leave as it was: without lag, or with a bound that never binds."""

import math

import numpy as np
import pytest
import torch

import geppo_continuous as geppo
import ppo_continuous as ppo
import spo_continuous as spo
import vaco_continuous as vaco
from conftest import TINY


def test_gaussian_kl_is_the_closed_form_and_torch_s():
    # KL(N(0, 1) || N(1, e^0.5)) = log(e^0.5 / 1) + (1 + 1) / (2 e) - 1/2 = 1/e
    kl = ppo.gaussian_kl(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.full((1, 1), 0.5))
    assert kl.item() == pytest.approx(1 / math.e, rel=1e-6)
    g = torch.Generator().manual_seed(0)
    mean_p, logstd_p, mean_q, logstd_q = (torch.randn(5, 3, generator=g) for _ in range(4))
    normal = torch.distributions.Normal
    expected = torch.distributions.kl_divergence(normal(mean_p, logstd_p.exp()), normal(mean_q, logstd_q.exp())).sum(-1)
    torch.testing.assert_close(ppo.gaussian_kl(mean_p, logstd_p, mean_q, logstd_q), expected)


def test_update_kl_is_zero_at_pi_t_and_grows_with_the_move():
    torch.manual_seed(0)
    actor, obs = ppo.Actor(4, 2), torch.randn(16, 4)
    with torch.no_grad():
        proximal = tuple(t.clone() for t in actor(obs))
        assert ppo.update_kl(actor, obs, proximal) == 0.0
        actor.logstd.add_(0.1)  # sigma x e^0.1 in both dimensions: 2 (0.1 + e^-0.2 / 2 - 1/2) per state
        assert ppo.update_kl(actor, obs, proximal) == pytest.approx(2 * (0.1 + math.exp(-0.2) / 2 - 0.5), rel=1e-5)


def minibatch(ages, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(ages)
    obs, actions = torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)
    behaviour = -torch.rand(n, generator=g) - 2
    return dict(obs=obs, actions=actions, behaviour_logprobs=behaviour,
                proximal_logprobs=behaviour + 0.3 * torch.randn(n, generator=g),
                advantages=torch.randn(n, generator=g), returns=torch.randn(n, generator=g),
                values=torch.randn(n, generator=g), ages=torch.as_tensor(ages))


def policy_gradient(mb, **settings):
    """d(policy loss)/d(actor parameters) of the decoupled loss on `mb` (no value or entropy term)."""
    torch.manual_seed(1)
    agent = ppo.Agent(4, 2)
    args = ppo.Args(clip_reference="proximal", vf_coef=0.0, **settings)
    params = {name: p.detach().requires_grad_() for name, p in agent.named_parameters()}
    loss, _ = ppo.minibatch_loss(params, agent, mb, args)
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, [params["actor.mean.0.weight"], params["actor.logstd"]])])


def test_max_policy_lag_trains_the_policy_on_the_recent_samples_alone():
    # ages 0-5 with a limit of 3: the loss is the kept samples' own loss (their advantages normalised among
    # themselves), scaled by their share of the minibatch, since the others stay in the mean's denominator
    ages = [0, 4, 1, 5, 2, 3, 0, 4, 1, 2, 5, 0]
    mb = minibatch(ages)
    kept = torch.as_tensor(ages) < 3
    alone = policy_gradient({key: value[kept] for key, value in mb.items()})
    share = kept.float().mean()
    torch.testing.assert_close(policy_gradient(mb, max_policy_lag=3), share * alone, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("ages", [[5] * 12, [5] * 11 + [0]])
def test_max_policy_lag_without_two_recent_samples_trains_no_policy(ages):
    # at K = 32 all 8 actors draw a snapshot 8 or more updates old in one update of 10, and a minibatch can hold one
    # recent sample: no mean and standard deviation to normalise by, so no policy gradient (and no NaN)
    assert policy_gradient(minibatch(ages), max_policy_lag=3).abs().max().item() == 0.0


def test_max_policy_lag_changes_nothing_where_every_sample_is_recent():
    mb = minibatch([0] * 12)  # K = 1: every sample acted by pi_T itself
    torch.testing.assert_close(policy_gradient(mb, max_policy_lag=1), policy_gradient(mb), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("module", [ppo, spo, vaco, geppo], ids=lambda m: m.__name__)
@pytest.mark.parametrize("max_update_kl, epochs", [(1e9, 2), (1e-12, 1)])
def test_max_update_kl_stops_the_epochs_once_the_policy_has_moved_that_far(train, monkeypatch, module, max_update_kl,
                                                                         epochs):
    # TINY: 2 updates of 4 minibatches, 2 epochs. A bound that never binds runs every step, bit for bit as
    # without it; one that any step passes stops each update after its first epoch.
    settings = dict(policy_buffer=2)
    steps, train_step, update_kl = [], module.train_step, module.update_kl
    monkeypatch.setattr(module, "train_step", lambda *a: steps.append(1) or train_step(*a))

    def measured_from_pi_t(actor, obs, proximal):  # pi_T's log-std a copy, not a view of the parameter that moves
        assert proximal[1].untyped_storage().data_ptr() != actor.logstd.untyped_storage().data_ptr()
        return update_kl(actor, obs, proximal)

    monkeypatch.setattr(module, "update_kl", measured_from_pi_t)
    _, bounded = train(module, exp_name="bounded", max_update_kl=max_update_kl, **settings)
    assert len(steps) == 2 * 4 * epochs
    if epochs == 2:
        monkeypatch.setattr(module, "train_step", train_step)  # not undo(): that would leave the run's folder too
        monkeypatch.setattr(module, "update_kl", update_kl)
        _, free = train(module, exp_name="free", **settings)
        for tag in ("losses/policy_loss", "charts/update_kl", "charts/episodic_return"):
            assert bounded[tag] == free[tag]
    else:
        assert max(bounded["charts/update_kl"]) > 1e-12
