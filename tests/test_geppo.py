"""GePPO (`geppo_continuous.py`): its band on a worked example with the gradient by hand, its learning-rate
rule, its runs (vaco_continuous.py --no-tv-filter without lag, its own way under lag) and its checks."""

import numpy as np
import pytest
import torch

import decoupled_ppo_continuous as decoupled
import geppo_continuous as geppo
import ppo_continuous as ppo
import vaco_continuous as vaco
from conftest import cli_flags, run_script

# Five samples, eps = 0.2. Per sample: the advantage A, w = pi_T/beta, rho = pi_theta/beta; the band [w - eps, w + eps].
#   1: A = +1, w = 1,   rho = 1.1: inside [0.8, 1.2]                      -> rho A = 1.1,  dL/dlog pi = -rho A / 5 = -0.22
#   2: A = +1, w = 2,   rho = 2.5: above [1.8, 2.2], A > 0: clipped       -> 2.2 A = 2.2,  no gradient
#   3: A = -1, w = 0.5, rho = 0.2: below [0.3, 0.7], A < 0: clipped       -> 0.3 A = -0.3, no gradient
#   4: A = -2, w = 5,   rho = 6.0: above [4.8, 5.2], A < 0: the min keeps  -> rho A = -12,  dL/dlog pi = -rho A / 5 = 2.4
#   5: A = +1, w = 5,   rho = 5.5: above [4.8, 5.2], A > 0: clipped       -> 5.2 A = 5.2,  no gradient
#      (decoupled PPO follows it: its r = rho / w = 1.1 is inside [0.8, 1.2])
# L = -(1.1 + 2.2 - 0.3 - 12 + 5.2) / 5 = 0.76
ADVANTAGES = [1.0, 1.0, -1.0, -2.0, 1.0]
WEIGHTS = [1.0, 2.0, 0.5, 5.0, 5.0]
RATIOS = [1.1, 2.5, 0.2, 6.0, 5.5]


def worked_example():
    behaviour = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5])
    proximal = behaviour + torch.tensor(WEIGHTS).log()
    newlogprob = (behaviour + torch.tensor(RATIOS).log()).requires_grad_()
    return newlogprob, behaviour, proximal, torch.tensor(ADVANTAGES)


def test_worked_example_loss_and_gradient():
    newlogprob, behaviour, proximal, advantages = worked_example()
    weight = (proximal - behaviour).exp()
    loss, rho = geppo.geppo_policy_loss(newlogprob, behaviour, weight, advantages, clip_coef=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.76, rel=1e-5)
    np.testing.assert_allclose(newlogprob.grad.numpy(), [-0.22, 0.0, 0.0, 2.4, 0.0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rho.detach().numpy(), RATIOS, rtol=1e-5)


def test_far_from_one_the_band_is_narrower_than_decoupled_ppo_s():
    # sample 5: pi_T finds the action 5 times likelier than beta did; decoupled PPO's band on r = rho / w is
    # [0.8, 1.2], rho in [4, 6], and follows the sample at r = 1.1; GePPO's is rho in [4.8, 5.2], and stops
    newlogprob, behaviour, proximal, advantages = worked_example()
    decoupled.decoupled_policy_loss(newlogprob, behaviour, proximal, advantages, clip_coef=0.2)[0].backward()
    assert newlogprob.grad[4].item() < 0


def test_without_lag_the_band_is_ppo_s_clip():
    g = torch.Generator().manual_seed(0)
    behaviour, advantages = torch.randn(64, generator=g), torch.randn(64, generator=g)
    grads = []
    for loss_of in (lambda lp: ppo.ppo_policy_loss(lp, behaviour, advantages, 0.2)[0],
                    lambda lp: geppo.geppo_policy_loss(lp, behaviour, torch.ones(64), advantages, 0.2)[0]):
        newlogprob = (behaviour + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(1))).requires_grad_()
        loss_of(newlogprob).backward()
        grads.append(newlogprob.grad)
    assert torch.equal(grads[0], grads[1]) and (grads[0] == 0).any() and (grads[0] != 0).any()


@pytest.mark.parametrize("tv, expected", [(0.11, 1 / 1.03), (0.1, 1.0), (0.05, 1.0), (0.0, 1.0)])
def test_the_rule_lowers_the_actor_rate_past_half_eps(tv, expected):
    args = geppo.Args()  # eps = 0.2: the threshold is 0.1; as in the authors' defaults, the rule never raises it
    assert geppo.adapted_lr_scale(1.0, tv, args) == pytest.approx(expected)
    assert geppo.adapted_lr_scale(0.5, tv, geppo.Args(adapt_factor=0.0)) == 0.5  # a factor of 0: the annealed rate


def test_update_tv_is_half_the_mean_distance_of_rho_from_w():
    torch.manual_seed(0)
    agent = geppo.Agent(3, 2)
    obs, actions = torch.randn(50, 3), torch.randn(50, 2)
    with torch.no_grad():
        current = geppo.gaussian_logprob(actions, *agent.actor(obs))
    behaviour = current - 0.3  # rho = e^0.3 for every sample
    # pi_T = the agent: w = rho
    flat = dict(obs=obs, actions=actions, behaviour_logprobs=behaviour, proximal_logprobs=current)
    assert geppo.update_tv(agent, flat) == pytest.approx(0.0, abs=1e-6)
    flat["proximal_logprobs"] = current + 0.1  # w = e^0.4
    assert geppo.update_tv(agent, flat) == pytest.approx(0.5 * (np.exp(0.4) - np.exp(0.3)), rel=1e-5)


COMPARED = ["losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
            "losses/tv_divergence", "losses/explained_variance"]


def test_without_lag_and_rule_it_trains_as_vaco_without_its_filter(train):
    # K = 1: w = pi_T/beta is 1 up to rounding (the learner evaluates the batch at once, the actors a step at a
    # time), so the band is PPO's clip and the weighted normalisation the plain one, up to rounding; both scripts
    # estimate V-trace advantages and regress the critic on them with the same value loss
    settings = dict(total_timesteps=512, learning_rate=3e-3)  # 4 updates, large steps: the clip acts
    _, reference = train(vaco, exp_name="vaco", tv_filter=False, **settings)
    _, geppo_run = train(geppo, exp_name="geppo", adapt_factor=0.0, **settings)
    assert max(reference["losses/clipfrac"]) > 0
    assert geppo_run["charts/episodic_return"][:3] == reference["charts/episodic_return"][:3]  # the first rollout
    for tag in COMPARED:
        np.testing.assert_allclose(geppo_run[tag], reference[tag], rtol=1e-4, atol=1e-6, err_msg=tag)
    assert geppo_run["charts/actor_learning_rate"] == geppo_run["charts/learning_rate"]


def test_under_lag_it_trains_its_own_way_and_the_rule_acts(train):
    settings = dict(total_timesteps=1024, learning_rate=1e-2, policy_buffer=4)  # large steps: TV passes eps / 2
    _, reference = train(vaco, exp_name="vaco", tv_filter=False, **settings)
    _, run = train(geppo, exp_name="geppo", **settings)
    assert not np.allclose(run["losses/policy_loss"][1:], reference["losses/policy_loss"][1:], rtol=1e-3)
    moved, critic, actor = run["charts/update_tv"], run["charts/learning_rate"], run["charts/actor_learning_rate"]
    assert actor[0] == critic[0]
    # each update's rate carries the factor of every earlier update whose TV passed eps / 2 = 0.1
    passed = np.cumsum([tv > 0.1 for tv in moved])[:-1]
    assert passed[-1] > 0
    np.testing.assert_allclose(np.divide(actor[1:], critic[1:]), 1.03 ** -passed, rtol=1e-5)
    assert all(0 <= v <= 1 for v in run["losses/clipfrac"]) and max(run["charts/backward_tv"]) > 0


def test_resume_keeps_the_learning_rate_factor(train, tmp_path):
    settings = dict(total_timesteps=512, learning_rate=1e-2, policy_buffer=2, save_model=True, checkpoint_every=2,
                    eval_episodes=0)
    run_dir, first = train(geppo, exp_name="first", **settings)
    (checkpoint,) = [p for p in __import__("glob").glob(f"{run_dir}/*_step*.cleanrl_model")]
    state = torch.load(checkpoint, weights_only=True)
    factor = 1.03 ** -sum(tv > 0.1 for tv in first["charts/update_tv"][:2])  # kept with Adam's state
    assert state["optimizer"]["lr_scale"].item() == pytest.approx(factor)
    _, resumed = train(geppo, exp_name="resumed", resume=checkpoint, **{**settings, "save_model": False})
    assert resumed["charts/actor_learning_rate"] == first["charts/actor_learning_rate"][2:]


def test_resume_refuses_vaco_s_checkpoint(train):
    # a vaco_continuous.py checkpoint fits GePPO's network, but carries no learning-rate factor: another script's
    run_dir, _ = train(vaco, exp_name="vaco", save_model=True, eval_episodes=0)
    with pytest.raises(SystemExit, match="not a checkpoint of geppo_continuous.py but of vaco_continuous.py"):
        train(geppo, exp_name="geppo", resume=f"{run_dir}/vaco.cleanrl_model", total_timesteps=512)


@pytest.mark.parametrize("flags, message", [
    (dict(clip_coef=0.0), "--clip-coef must be in (0, inf), got 0.0"),
    (dict(adapt_factor=-0.1), "--adapt-factor must be in [0, inf), got -0.1"),
])
def test_bad_input_is_one_clear_error(flags, message, tmp_path):
    result = run_script("geppo_continuous.py", *cli_flags(**flags), cwd=tmp_path)
    assert result.returncode != 0 and message in result.stderr
    assert result.stderr.strip().count("\n") == 0 and not (tmp_path / "runs").exists()
