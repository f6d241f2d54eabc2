"""What ppo_continuous.py, spo_continuous.py and vaco_continuous.py share: env pipeline, lag
simulator, GAE, checkpoints and resuming, logging, seeding and input checks. Each test runs
against every script, except the slow logging and video ones, which run ppo_continuous.py only: the
others run its very code there (test_equivalence.py compares the sources)."""

import glob
import os
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_continuous
import spo_continuous
import vaco_async
import vaco_continuous
from conftest import TINY, cli_flags, read_scalars, run_script

SCRIPTS = [ppo_continuous, spo_continuous, vaco_continuous]
script = pytest.mark.parametrize("module", SCRIPTS, ids=lambda m: m.__name__)


# --- GAE ----------------------------------------------------------------------------------------

def random_batch(T=40, N=3, seed=0):
    """Rewards, values, next values; terminations and time-limit truncations inside the batch.
    As in a rollout, next_values[t] = values[t + 1] unless the episode ended at t (then it is
    V(final observation), another state)."""
    g = torch.Generator().manual_seed(seed)
    rewards, values, final_values = (torch.randn(T, N, generator=g) for _ in range(3))
    terminations = (torch.rand(T, N, generator=g) < 0.08).float()
    truncations = (torch.rand(T, N, generator=g) < 0.08).float() * (1 - terminations)
    assert terminations.sum() > 0 and truncations.sum() > 0
    dones = torch.clamp(terminations + truncations, max=1)
    next_values = torch.where(dones.bool(), final_values, torch.cat([values[1:], final_values[-1:]]))
    return rewards, values, next_values, terminations, dones


def gae_direct(rewards, values, next_values, terminations, dones, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, summed until the episode ends or the batch does."""
    T, N = rewards.shape
    deltas = rewards + gamma * (1 - terminations) * next_values - values
    advantages = torch.zeros(T, N)
    for n in range(N):
        for t in range(T):
            for k in range(t, T):
                advantages[t, n] += (gamma * lam) ** (k - t) * deltas[k, n]
                if dones[k, n]:
                    break
    return advantages


@script
def test_gae_matches_direct_sum(module):
    batch = random_batch()
    expected = gae_direct(*batch, gamma=0.99, lam=0.95)
    torch.testing.assert_close(module.compute_gae(*batch, 0.99, 0.95), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("terminated, expected", [(1.0, [6.5, 1.0, 16.0]), (0.0, [11.5, 11.0, 16.0])])
def test_gae_bootstraps_truncation_not_termination(terminated, expected):
    # the episode ends at t = 1; next_values[1] = V(final observation) counts only if truncated
    col = lambda *x: torch.tensor(x).unsqueeze(1)  # noqa: E731
    advantages = ppo_continuous.compute_gae(col(1.0, 1.0, 1.0), col(0.0, 0.0, 0.0), col(10.0, 20.0, 30.0),
                                            col(0.0, terminated, 0.0), col(0.0, 1.0, 0.0), gamma=0.5, lam=1.0)
    torch.testing.assert_close(advantages, col(*expected))


# --- lag simulator ------------------------------------------------------------------------------

@script
def test_policy_buffer_k1_is_the_current_policy(module):
    agent = module.Agent(11, 3)
    buffer = module.PolicyBuffer(agent.actor, size=1)
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.1)
    obs = torch.randn(16, 11)
    for _ in range(3):  # an update, then the actors pick up the new policy
        agent.actor(obs)[0].sum().backward()
        optimizer.step()
        buffer.push(agent.actor)
        assert len(buffer.snapshots) == 1
        for got, want in zip(buffer[0](obs), agent.actor(obs)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@script
def test_policy_buffer_ages_and_frozen_snapshots(module):
    actor = module.Actor(5, 2)
    buffer = module.PolicyBuffer(actor, size=4)
    rng = np.random.default_rng(0)
    ages, groups = buffer.sample_ages(100, rng)
    assert set(ages) == {0} and len(groups) == 1  # only the initial policy exists
    first = [p.clone() for p in buffer[0].parameters()]
    for _ in range(10):
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(1.0)  # the learner moves on...
        buffer.push(actor)
    ages, groups = buffer.sample_ages(10_000, rng)
    assert ages.min() == 0 and ages.max() == 3  # never older than K - 1, every age drawn
    # the groups `act` takes: every actor once, under the age it drew
    assert sorted(age for age, _ in groups) == [0, 1, 2, 3]
    assert sorted(torch.cat([actors for _, actors in groups]).tolist()) == list(range(10_000))
    assert all((ages[actors.numpy()] == age).all() for age, actors in groups)
    assert abs(np.mean(ages) - 1.5) < 0.1  # uniform
    for age in range(4):  # ...and the snapshots are frozen copies of what it was
        snapshot = list(buffer[age].parameters())
        assert all(not p.requires_grad for p in snapshot)
        torch.testing.assert_close(snapshot[0], list(actor.parameters())[0] - age)
    buffer.push(actor)
    assert len(buffer.snapshots) == 4
    assert all(not torch.equal(a, b) for a, b in zip(first, buffer[3].parameters()))


def test_policy_buffer_at_k32_fills_in_31_updates_then_averages_age_15_5():
    # the largest lag the study runs: snapshots 0-31 updates old once the buffer is full, 15.5 on average
    actor, rng = ppo_continuous.Actor(5, 2), np.random.default_rng(0)
    buffer = ppo_continuous.PolicyBuffer(actor, size=32)
    for update in range(1, 41):
        buffer.push(actor)  # after update u the buffer holds min(u + 1, 32) snapshots: full after 31
        assert len(buffer.snapshots) == min(update + 1, 32)
        ages, _ = buffer.sample_ages(20_000, rng)
        assert ages.max() == min(update, 31) and abs(ages.mean() - min(update, 31) / 2) < 0.35  # 5 std errors
    counts = np.bincount(buffer.sample_ages(320_000, rng)[0], minlength=32)
    assert len(counts) == 32 and counts.min() > 0.9 * 10_000 and counts.max() < 1.1 * 10_000  # uniform over 0-31


# --- env pipeline: SAME_STEP autoreset, final observations --------------------------------------

@script
def test_final_observation_of_a_truncated_episode_is_kept(module):
    if "ThreeStepPendulum-v0" not in gym.registry:
        gym.register("ThreeStepPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=3)
    envs = module.make_envs(module.Args(env_id="ThreeStepPendulum-v0", num_envs=2), run_name="test")
    reference = gym.make("ThreeStepPendulum-v0")  # env 1 on its own, same seed and actions
    obs, _ = envs.reset(seed=7)
    ref_obs, _ = reference.reset(seed=8)
    actions = np.full((2, 1), 0.5, np.float32)
    for t in range(3):
        obs, _, terminated, truncated, infos = envs.step(actions)
        ref_obs, _, _, ref_truncated, _ = reference.step(actions[1])
        assert bool(truncated[1]) == ref_truncated == (t == 2)
    assert not terminated.any()
    next_obs = module.with_final_obs(obs, infos)
    np.testing.assert_allclose(next_obs[1], ref_obs, rtol=1e-6)  # s_{t+1} is the real final one
    assert not np.allclose(obs[1], ref_obs)  # while obs holds the new episode's first
    ref_obs, _ = reference.reset()
    np.testing.assert_allclose(obs[1], ref_obs, rtol=1e-6)
    # no dummy transition: the next step is a real step of the new episode
    obs, reward, terminated, truncated, infos = envs.step(actions)
    ref_obs, ref_reward, *_ = reference.step(actions[1])
    np.testing.assert_allclose(obs[1], ref_obs, rtol=1e-6)
    assert reward[1] == pytest.approx(ref_reward) and "_final_obs" not in infos
    envs.close()


def three_step_envs(module, num_envs=2):
    if "ThreeStepPendulum-v0" not in gym.registry:
        gym.register("ThreeStepPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=3)
    return module.make_envs(module.Args(env_id="ThreeStepPendulum-v0", num_envs=num_envs), run_name="test")


@pytest.mark.parametrize("module", SCRIPTS + [vaco_async], ids=lambda m: m.__name__)
def test_every_episode_logs_the_sum_of_its_rewards(module):
    # gymnasium before 1.4 dropped the first reward (and one step) of every episode after an env's
    # first under SAME_STEP autoreset; the first episode never shows it, so check three of them
    envs = three_step_envs(module)
    envs.reset(seed=0)
    rewards, logged = [], []
    for t in range(9):
        _, reward, _, _, infos = envs.step(np.full((2, 1), 0.3 * (t % 3) - 0.2, np.float32))
        rewards.append(reward)
        if "_episode" in infos:
            logged.append((t, infos["episode"]["r"][infos["_episode"]], infos["episode"]["l"][infos["_episode"]]))
    envs.close()
    assert [t for t, _, _ in logged] == [2, 5, 8]
    for t, returns, lengths in logged:
        np.testing.assert_allclose(returns, np.sum(rewards[t - 2 : t + 1], axis=0), rtol=1e-6)
        np.testing.assert_array_equal(lengths, [3, 3])


# --- checkpoints --------------------------------------------------------------------------------

@script
def test_checkpoint_round_trip(module, tmp_path):
    agent = module.Agent(11, 3)
    obs_rms = module.RunningMeanStd(shape=(11,))
    obs_rms.update(np.random.default_rng(0).normal(3.0, 2.0, size=(50, 11)))
    path = str(tmp_path / "agent.cleanrl_model")
    module.save_checkpoint(path, {"agent": agent.state_dict(), "obs_rms": module.rms_state(obs_rms)})
    saved = torch.load(path, weights_only=True)
    loaded, loaded_rms = module.Agent(11, 3), module.RunningMeanStd(shape=(11,))
    loaded.load_state_dict(saved["agent"])
    module.load_rms_state(loaded_rms, saved["obs_rms"])
    raw = np.random.default_rng(1).normal(3.0, 2.0, size=(8, 11))
    obs = torch.as_tensor(module.normalize_obs(raw, loaded_rms))
    torch.testing.assert_close(obs, torch.as_tensor(module.normalize_obs(raw, obs_rms)))
    for got, want in zip(loaded.actor(obs), agent.actor(obs)):
        torch.testing.assert_close(got, want)
    assert os.listdir(tmp_path) == ["agent.cleanrl_model"]  # written through a temporary file, renamed


class Payload:
    """What a tampered checkpoint could carry: unpickling it would call print (or anything else)."""

    def __reduce__(self):
        return (print, ("this ran while loading",))


@script
def test_a_checkpoint_holding_a_pickled_object_is_refused(module, tmp_path, capsys):
    path = str(tmp_path / "tampered.cleanrl_model")
    torch.save({"agent": Payload()}, path)
    with pytest.raises(SystemExit, match="error: refusing to load .*tampered.cleanrl_model"):
        module.load_checkpoint(path)
    assert "this ran" not in capsys.readouterr().out


@script
def test_resume_continues_steps_updates_and_state(module, train):
    # 2 envs x 64 steps per update, 4 minibatches x 2 epochs = 8 optimiser steps per update
    run_dir, _ = train(module, total_timesteps=384, save_model=True, checkpoint_every=1, eval_episodes=0)
    checkpoints = sorted(glob.glob(f"{run_dir}/*_step*.cleanrl_model"))
    assert [c.rsplit("_step", 1)[1] for c in checkpoints] == ["128.cleanrl_model", "256.cleanrl_model"]
    state = module.load_checkpoint(checkpoints[0])
    assert (state["global_step"], state["iteration"]) == (128, 1)
    assert state["obs_rms"]["count"] == pytest.approx(2 + 128, abs=1e-3)  # reset + 64 steps x 2 envs

    resumed_dir, resumed = train(module, total_timesteps=512, resume=checkpoints[0], exp_name="resumed",
                                 save_model=True, eval_episodes=0)
    assert resumed_dir != run_dir  # logs go to a new run folder; the first run's are untouched
    assert len(resumed["charts/SPS"]) == 3  # updates 2, 3, 4
    assert resumed["charts/learning_rate"][0] == pytest.approx(3e-4 * (1 - 1 / 4))  # schedule continues
    final = module.load_checkpoint(glob.glob(f"{resumed_dir}/resumed.cleanrl_model")[0])
    assert (final["global_step"], final["iteration"]) == (512, 4)
    # optimiser and statistics carried on from the checkpoint rather than starting afresh
    assert final["optimizer"]["step"].item() == 8 + 3 * 8
    assert final["obs_rms"]["count"] == pytest.approx(130 + 2 + 3 * 128, abs=1e-3)


@script
def test_resume_restores_the_lag_simulator_as_saved(module, train):
    # a checkpoint taken before the buffer is full: the resumed buffer holds exactly its snapshots,
    # not the fresh initial policy beside them
    run_dir, _ = train(module, total_timesteps=384, policy_buffer=4, save_model=True, checkpoint_every=1,
                       eval_episodes=0)
    path = sorted(glob.glob(f"{run_dir}/*_step*.cleanrl_model"))[0]
    checkpoint = module.load_checkpoint(path)
    assert len(checkpoint["policy_buffer"]) == 2  # the initial policy and the first update's
    args = module.Args(**{**TINY, "total_timesteps": 384, "policy_buffer": 4, "resume": path})
    args.batch_size, args.num_iterations = 128, 3
    assert module.check_args(args)["global_step"] == 128  # the checkpoint, once checked against these settings
    agent = module.Agent(11, 3)
    saved = dict(agent=agent, optimizer=module.adam_state(dict(agent.named_parameters())),
                 obs_rms=module.RunningMeanStd(shape=(11,)), reward_rms=module.RunningMeanStd(),
                 policy_buffer=module.PolicyBuffer(agent.actor, 4), generator=torch.Generator(),
                 action_generator=torch.Generator(), lag_rng=np.random.default_rng(0))
    assert module.resume(checkpoint, saved, args) == (128, 2, 3)
    snapshots = saved["policy_buffer"].snapshots
    assert len(snapshots) == 2
    for snapshot, state in zip(snapshots, checkpoint["policy_buffer"]):
        for name, value in snapshot.state_dict().items():
            torch.testing.assert_close(value, state[name], rtol=0, atol=0)
    torch.testing.assert_close(saved["optimizer"]["step"], checkpoint["optimizer"]["step"])


@script
def test_resume_refuses_a_finished_or_foreign_checkpoint(module, train):
    run_dir, _ = train(module, total_timesteps=256, save_model=True, eval_episodes=0)
    (final,) = glob.glob(f"{run_dir}/*.cleanrl_model")
    for overrides, message in [(dict(total_timesteps=256), "after the checkpoint's step 256: raise it to train on"),
                               (dict(env_id="Ant-v4", total_timesteps=512), "--env-id Ant-v4 differs from Hopper-v4"),
                               (dict(resume="missing.pt"), "error: missing.pt: no such file")]:
        with pytest.raises(SystemExit, match=message):
            train(module, **{"resume": final, "exp_name": "again", **overrides})
    assert len(os.listdir("runs")) == 1  # refused before anything was written


# --- training runs ------------------------------------------------------------------------------

@script
@pytest.mark.parametrize("env_id", ["Hopper-v4", "Ant-v4"])
def test_smoke_run_logs_lag_and_saves(module, env_id, train, capsys):
    run_dir, scalars = train(module, env_id=env_id, policy_buffer=3, total_timesteps=384, save_model=True,
                             eval_episodes=1)
    out = capsys.readouterr().out
    assert "SPS: " in out and "step 384/384" in out
    lag_max = scalars["charts/policy_lag_max"]
    assert lag_max[0] == 0 and all(m <= i for i, m in enumerate(lag_max))  # < snapshots held, <= K - 1
    for tag in ["losses/value_loss", "losses/policy_loss", "losses/approx_kl", "losses/tv_divergence",
                "charts/backward_tv", "charts/SPS", "charts/learning_rate", "losses/explained_variance"]:
        assert len(scalars[tag]) == 3 and np.isfinite(scalars[tag]).all(), tag
    assert scalars["charts/backward_tv"][0] == pytest.approx(0.0, abs=1e-5)  # no lag yet
    assert scalars["charts/learning_rate"][0] == pytest.approx(3e-4)
    assert len(scalars["eval/episodic_return"]) == 1
    assert glob.glob(f"{run_dir}/*.cleanrl_model")
    if env_id == "Hopper-v4":  # Hopper falls over fast: episodes finish within the budget
        assert len(scalars["charts/episodic_return"]) == len(scalars["charts/episodic_length"]) > 0


@script
def test_k1_acts_with_the_learners_policy(module, train):
    _, scalars = train(module, policy_buffer=1, total_timesteps=512)
    assert scalars["charts/policy_lag_max"] == [0, 0, 0, 0]
    assert max(scalars["charts/backward_tv"]) < 1e-5  # behaviour == learner at every update


@script
def test_same_seed_same_returns(module, train):
    _, first = train(module, exp_name="a", seed=3)
    _, second = train(module, exp_name="b", seed=3)
    _, other = train(module, exp_name="c", seed=4)
    assert first["charts/episodic_return"] == second["charts/episodic_return"]
    assert first["losses/value_loss"] == second["losses/value_loss"]
    assert first["charts/episodic_return"] != other["charts/episodic_return"]


@pytest.mark.floatfree
def test_track_writes_an_offline_wandb_run(tmp_path):
    # one script suffices: the others' logging is ppo_continuous.py's own code (test_equivalence.py).
    # A subprocess, as users run it: wandb's TensorBoard patch outlives a run within one process
    flags = cli_flags(**TINY)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    result = run_script("ppo_continuous.py", *flags, "--track", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    (run,) = glob.glob(f"{tmp_path}/wandb/offline-run-*")
    assert glob.glob(f"{run}/*.wandb") and glob.glob(f"{tmp_path}/runs/*/events.out.tfevents.*")


@script
def test_existing_run_directory_is_never_reused(module, train):
    now = int(time.time())
    for t in range(now, now + 30):  # whatever second the run starts in, its folder exists
        os.makedirs(f"runs/Hopper-v4__x__1__{t}/keep")
    with pytest.raises(SystemExit, match="File exists"):
        train(module, exp_name="x")
    assert len(glob.glob("runs/*/keep")) == 30


# --- bad input ----------------------------------------------------------------------------------

BAD_INPUTS = [
    (dict(policy_buffer=0), "--policy-buffer must be in [1, inf), got 0"),
    (dict(num_minibatches=5), "not divisible by --num-minibatches 5"),
    (dict(total_timesteps=0), "--total-timesteps must be in [1, inf), got 0"),
    (dict(num_minibatches=0), "--num-minibatches must be in [1, inf), got 0"),
    (dict(total_timesteps=100), "leaves less than a batch (128) to train"),
    (dict(num_envs=1, num_steps=32, num_minibatches=32), "a minibatch of 1 sample cannot normalise its advantages"),
    (dict(exp_name="a/b"), "--exp-name names the run's folder: a plain name, not 'a/b'"),
    (dict(env_id="Hoper-v4"), "unknown environment id 'Hoper-v4' (did you mean Hopper-v4?)"),
    (dict(env_id="CartPole-v1"), "CartPole-v1 has a Discrete action space"),
]


@script
@pytest.mark.parametrize("overrides, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_clear_error(module, overrides, message, train):
    with pytest.raises(SystemExit) as exc:
        train(module, **overrides)
    assert str(exc.value).startswith("error: ") and message in str(exc.value)
    assert not os.path.exists("runs")  # nothing written


@pytest.mark.floatfree
@script
def test_bad_input_from_the_command_line(module, tmp_path):
    result = run_script(f"{module.__name__}.py", "--env-id", "CartPole-v1", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: CartPole-v1 has a Discrete action space")


@pytest.mark.floatfree
def test_capture_video_records_env_0(train):
    # one script suffices: the others' env pipeline is ppo_continuous.py's own code (test_equivalence.py)
    run_dir, _ = train(ppo_continuous, capture_video=True)
    videos = glob.glob(f"videos/{os.path.basename(run_dir)}/*.mp4")
    assert videos and all(os.path.getsize(v) > 1000 for v in videos)
