"""VACO's two mechanisms: V-trace advantage alignment and TV filtering. The unit tests run against
every script that implements them (vaco_continuous.py, vaco_async.py)."""

import numpy as np
import pytest
import torch
from test_continuous import random_batch

import vaco_async
import vaco_continuous as vaco

GAMMA, LAM = 0.99, 0.95
# the parameter shadows the module `vaco` inside each unit test
every_script = pytest.mark.parametrize("vaco", [vaco, vaco_async], ids=lambda m: m.__name__)


def lag_batch(T=40, N=3, seed=0, log_ratio_std=1.0):
    """A batch with episodes ending inside it and log(pi_T / beta) ~ N(0, std): ratios far above
    and below the clips. Returns the keyword arguments of vtrace_advantages."""
    rewards, values, next_values, terminations, dones = random_batch(T, N, seed)
    g = torch.Generator().manual_seed(seed + 1)
    behaviour = torch.randn(T, N, generator=g)
    proximal = behaviour + log_ratio_std * torch.randn(T, N, generator=g)
    return dict(behaviour_logprobs=behaviour, proximal_logprobs=proximal, rewards=rewards, values=values,
                next_values=next_values, terminations=terminations, dones=dones)


def vtrace_direct(behaviour_logprobs, proximal_logprobs, rewards, values, next_values, terminations, dones,
                  gamma, lam, rho_bar, c_bar):
    """The definition, summed term by term (O(T^2)):
    v_s = V(s_s) + sum_{t >= s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, the product cut at episode ends;
    A_s = r_s + gamma (1 - term_s) [V(s_{s+1}) + lam (1 - done_s) (v_{s+1} - V(s_{s+1}))] - V(s_s)."""
    T, N = rewards.shape
    weight = (proximal_logprobs - behaviour_logprobs).exp()
    deltas = weight.clamp(max=rho_bar) * (rewards + gamma * (1 - terminations) * next_values - values)
    cs = lam * weight.clamp(max=c_bar)
    vs = values.clone()
    for n in range(N):
        for s in range(T):
            coef = 1.0
            for t in range(s, T):
                vs[s, n] += coef * deltas[t, n]
                if dones[t, n]:
                    break
                coef *= gamma * cs[t, n]
    advantages = torch.zeros(T, N)
    for n in range(N):
        for s in range(T):
            trace = vs[s + 1, n] - values[s + 1, n] if s + 1 < T else 0.0
            advantages[s, n] = (rewards[s, n] + gamma * (1 - terminations[s, n])
                                * (next_values[s, n] + lam * (1 - dones[s, n]) * trace) - values[s, n])
    return advantages, vs


@every_script
@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 0.5), (0.7, 1.3)])
def test_vtrace_matches_its_definition(vaco, rho_bar, c_bar):
    batch = lag_batch()
    weight = (batch["proximal_logprobs"] - batch["behaviour_logprobs"]).exp()
    assert (weight > 2.5).any() and (weight < 0.3).any()  # both clips are active
    got = vaco.vtrace_advantages(**batch, gamma=GAMMA, lam=LAM, rho_bar=rho_bar, c_bar=c_bar)
    expected = vtrace_direct(**batch, gamma=GAMMA, lam=LAM, rho_bar=rho_bar, c_bar=c_bar)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@every_script
def test_vtrace_on_policy_is_gae(vaco):
    batch = lag_batch()
    batch["proximal_logprobs"] = batch["behaviour_logprobs"]  # beta = pi_T
    advantages, value_targets = vaco.vtrace_advantages(**batch, gamma=GAMMA, lam=LAM)
    gae = vaco.compute_gae(batch["rewards"], batch["values"], batch["next_values"], batch["terminations"],
                           batch["dones"], GAMMA, LAM)
    torch.testing.assert_close(advantages, gae, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value_targets, gae + batch["values"], rtol=1e-5, atol=1e-5)


@every_script
def test_vtrace_is_cut_at_episode_boundaries(vaco):
    batch = lag_batch(T=30)
    batch["dones"][11] = 1.0  # every env's episode ends at t = 11 (terminated for env 0 only)
    batch["terminations"][11] = torch.tensor([1.0, 0.0, 0.0])
    whole = vaco.vtrace_advantages(**batch, gamma=GAMMA, lam=LAM)
    first = vaco.vtrace_advantages(**{k: v[:12] for k, v in batch.items()}, gamma=GAMMA, lam=LAM)
    second = vaco.vtrace_advantages(**{k: v[12:] for k, v in batch.items()}, gamma=GAMMA, lam=LAM)
    for w, f, s in zip(whole, first, second):
        torch.testing.assert_close(w, torch.cat([f, s]))


@every_script
def test_vtrace_agrees_with_torchrl(vaco):
    functional = pytest.importorskip("torchrl.objectives.value.functional")
    batch = lag_batch()
    rho_bar, c_bar = 1.0, 0.9
    # torchrl's V-trace has lambda = 1 and its advantage carries the min(rho_bar, rho) factor
    advantages, value_targets = vaco.vtrace_advantages(**batch, gamma=GAMMA, lam=1.0, rho_bar=rho_bar, c_bar=c_bar)
    to_torchrl = lambda x: x.T.unsqueeze(-1)  # noqa: E731  [T, N] -> [N, T, 1]
    ref_advantages, ref_targets = functional.vtrace_advantage_estimate(
        GAMMA, to_torchrl(batch["proximal_logprobs"]), to_torchrl(batch["behaviour_logprobs"]),
        to_torchrl(batch["values"]), to_torchrl(batch["next_values"]), to_torchrl(batch["rewards"]),
        to_torchrl(batch["dones"]).bool(), to_torchrl(batch["terminations"]).bool(),
        rho_thresh=rho_bar, c_thresh=c_bar,
    )
    weight = (batch["proximal_logprobs"] - batch["behaviour_logprobs"]).exp()
    torch.testing.assert_close(to_torchrl(value_targets), ref_targets, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(to_torchrl(weight.clamp(max=rho_bar) * advantages), ref_advantages, rtol=1e-5, atol=1e-5)


# --- TV filter ----------------------------------------------------------------------------------

RATIOS = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.0])
ADVANTAGES = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])


def filter_loss(vaco, tv_threshold):
    newlogprob = RATIOS.log().requires_grad_()
    loss, ratio, tv, filtered_fraction = vaco.vaco_policy_loss(newlogprob, torch.zeros(5), ADVANTAGES, tv_threshold)
    torch.testing.assert_close(ratio, RATIOS)  # rho = pi_theta / beta, returned for the statistics
    loss.backward()
    return loss, tv, filtered_fraction, newlogprob.grad


@every_script
def test_tv_filter_above_threshold(vaco):
    # tv = 1/2 mean|r - 1| = 0.2 > 0.1: samples 0 (A > 0, r > 1) and 3 (A < 0, r < 1) would move
    # the policy further from beta and are filtered; sample 4 (r = 1) is not.
    loss, tv, filtered_fraction, grad = filter_loss(vaco, tv_threshold=0.1)
    assert tv.item() == pytest.approx(0.2)
    assert filtered_fraction.item() == pytest.approx(0.4)
    assert loss.item() == pytest.approx(-(1.5 + 0.5 - 1.5 - 0.5 + 1.0) / 5)  # all samples in the mean
    # d(-r A / 5) / d log r = -r A / 5 on kept samples, exactly 0 on filtered ones
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.1, 0.3, 0.0, -0.2]))
    assert grad[0].item() == 0.0 and grad[3].item() == 0.0


@every_script
def test_tv_filter_below_threshold_keeps_everything(vaco):
    loss, tv, filtered_fraction, grad = filter_loss(vaco, tv_threshold=0.3)
    assert filtered_fraction.item() == 0.0
    torch.testing.assert_close(grad, torch.tensor([-0.3, -0.1, 0.3, 0.1, -0.2]))  # unclipped -r A / 5


@every_script
def test_tv_filter_has_no_ratio_clipping(vaco):
    # far outside PPO's [0.8, 1.2] but on the side that brings pi back to beta: full gradient
    newlogprob = torch.tensor([np.log(3.0)], requires_grad=True)
    loss, _, tv, filtered_fraction = vaco.vaco_policy_loss(newlogprob, torch.zeros(1), torch.tensor([-1.0]), 0.2)
    loss.backward()
    assert tv.item() == pytest.approx(1.0) and filtered_fraction.item() == 0.0
    assert newlogprob.grad.item() == pytest.approx(3.0)


@every_script
def test_tv_filter_against_the_behaviour_policy_by_default(vaco):
    # the behaviour log-probs as the TV's reference (`proximal_logprobs`): the paper's rule, the same as passing none
    newlogprob = RATIOS.log().requires_grad_()
    explicit = vaco.vaco_policy_loss(newlogprob, torch.zeros(5), ADVANTAGES, 0.1, proximal_logprobs=torch.zeros(5))
    explicit[0].backward()
    loss, tv, filtered_fraction, grad = filter_loss(vaco, tv_threshold=0.1)
    assert explicit[0].item() == loss.item() and explicit[2].item() == tv.item()
    assert explicit[3].item() == filtered_fraction.item()
    torch.testing.assert_close(newlogprob.grad, grad)


@every_script
def test_tv_filter_against_the_proximal_policy(vaco):
    # pi_T gave these actions twice beta's probability; pi_theta has moved back towards beta:
    # r = pi_theta/beta = 1.5 but q = pi_theta/pi_T = 0.75. With A > 0 the paper's rule sees the
    # policy moving away from beta and filters; against pi_T the same step moves q back to 1 and
    # is kept, and the surrogate's ratio, hence the gradient, stays pi_theta/beta.
    behaviour, proximal = torch.zeros(4), torch.full((4,), np.log(2.0))
    advantages = torch.ones(4)
    for reference, tv_expected, filtered_expected in [(None, 0.25, 1.0), (proximal, 0.125, 0.0)]:
        newlogprob = torch.full((4,), np.log(1.5), requires_grad=True)
        loss, _, tv, filtered_fraction = vaco.vaco_policy_loss(newlogprob, behaviour, advantages, 0.1, reference)
        loss.backward()
        assert tv.item() == pytest.approx(tv_expected)
        assert filtered_fraction.item() == filtered_expected
        assert loss.item() == pytest.approx(-1.5)  # -mean(r A) either way
        expected_grad = 0.0 if filtered_expected else -1.5 / 4  # d(-r A / 4) / d log r
        torch.testing.assert_close(newlogprob.grad, torch.full((4,), expected_grad))


# --- training runs ------------------------------------------------------------------------------

ABLATIONS = {
    "default": {},
    "no-advantage-alignment": dict(advantage_alignment=False),
    "no-tv-filter": dict(tv_filter=False),
    "proximal": dict(tv_reference="proximal"),
}


@pytest.mark.parametrize("overrides", ABLATIONS.values(), ids=ABLATIONS.keys())
def test_vaco_runs_and_logs_filtering(overrides, train):
    _, scalars = train(vaco, policy_buffer=4, total_timesteps=512, update_epochs=4, **overrides)
    for tag in ["losses/tv_divergence", "charts/backward_tv", "charts/rho_clipped_fraction"]:
        assert len(scalars[tag]) == 4 and np.isfinite(scalars[tag]).all(), tag
    assert scalars["charts/backward_tv"][0] == pytest.approx(0.0, abs=1e-5)
    if not overrides.get("tv_filter", True):
        assert "losses/filtered_fraction" not in scalars and "losses/filter_tv" not in scalars
        return
    for tag in ["losses/filtered_fraction", "losses/filter_on_fraction"]:
        assert all(0.0 <= f <= 1.0 for f in scalars[tag]), tag
    # the TV the filter compares with delta: against beta it is the logged TV(pi_theta, beta)
    same = np.allclose(scalars["losses/filter_tv"], scalars["losses/tv_divergence"], rtol=1e-5)
    assert same == (overrides.get("tv_reference", "behaviour") == "behaviour")


def test_proximal_reference_is_the_papers_rule_at_k1(train):
    # K = 1: pi_T = beta, so both references filter the same samples and train identically
    # (delta is small so that the filter acts)
    _, behaviour = train(vaco, exp_name="b", total_timesteps=512, tv_threshold=0.001, tv_reference="behaviour")
    _, proximal = train(vaco, exp_name="p", total_timesteps=512, tv_threshold=0.001, tv_reference="proximal")
    assert max(behaviour["losses/filtered_fraction"]) > 0
    for tag in ["losses/filtered_fraction", "losses/policy_loss", "charts/episodic_return"]:
        assert behaviour[tag] == proximal[tag], tag
    np.testing.assert_allclose(behaviour["losses/filter_tv"], proximal["losses/filter_tv"], rtol=1e-5)


def test_tiny_threshold_filters(train):
    # delta far below any drift: every minibatch past the first filters about half its samples
    _, scalars = train(vaco, total_timesteps=256, tv_threshold=1e-6)
    assert 0.2 < np.mean(scalars["losses/filtered_fraction"]) < 0.6


@pytest.mark.parametrize("flag, value", [("tv_threshold", 0.0), ("tv_threshold", -0.1), ("rho_bar", 0.0),
                                         ("c_bar", -1.0)])
def test_vaco_bad_input(flag, value, train):
    with pytest.raises(SystemExit, match=rf"error: --{flag.replace('_', '-')} must be in \(0, inf\), got {value}"):
        train(vaco, **{flag: value})
