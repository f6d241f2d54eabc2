"""vaco_async.py: messages, checkpoints and launch checks in-process; then real runs of the learner
and its actor processes (spawned, and under torchrun), each in its own session with a hard timeout,
after which no process it started may be alive."""

import collections
import contextlib
import glob
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch

import vaco_async
import vaco_continuous
from conftest import ROOT, cli_flags, read_scalars
from test_continuous import Payload
from test_keeps_its_work import KINDS, not_ours

SCRIPT = os.path.join(ROOT, "vaco_async.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, of this Python
# A few seconds of training: updates of 2 envs x 32 steps in all (so 2 actors send 1 env x 32 steps each).
TINY = dict(env_id="Hopper-v4", num_envs=2, num_steps=32, num_minibatches=4, update_epochs=2, total_timesteps=512,
            compile=False)  # eager: tests/test_compile.py checks the compiled update


def flags(**overrides):
    """Command-line flags of TINY with `overrides`."""
    return cli_flags(**{**TINY, **overrides})


# --- messages -----------------------------------------------------------------------------------

def test_segment_fields_view_one_message_without_overlap():
    layout = vaco_async.SegmentLayout(num_steps=5, num_envs=3, obs_dim=4, act_dim=2)
    message = torch.zeros(layout.size, dtype=torch.float64)
    fields = layout.views(message)
    assert layout.steps == 15 and fields["obs"].shape == (5, 3, 4) and fields["reset_obs"].shape == (3, 4)
    for value, (name, array) in enumerate(fields.items(), start=1):
        assert array.shape == layout.shapes[name]
        array[...] = value  # each field writes its own part of the message, and only that
    counts = torch.bincount(message.long())
    assert counts[0] == 0 and [counts[v].item() for v in range(1, len(fields) + 1)] == [
        int(np.prod(shape)) for shape in layout.shapes.values()]
    # what the learner reads from the bytes it received, through its own layout, is what was written
    received = vaco_async.SegmentLayout(5, 3, 4, 2).views(message.clone())
    for value, name in enumerate(fields, start=1):
        assert (received[name] == value).all(), name


def test_policy_round_trip_carries_weights_and_statistics_exactly():
    actor, receiver = vaco_async.Actor(6, 2), vaco_async.Actor(6, 2)
    obs_rms, received_rms = vaco_async.RunningMeanStd(shape=(6,)), vaco_async.RunningMeanStd(shape=(6,))
    obs_rms.update(np.random.default_rng(0).normal(3.0, 2.0, size=(100, 6)))
    weights = vaco_async.pack_policy(actor, obs_rms)
    assert weights.dtype == torch.float64 and weights.ndim == 1
    vaco_async.unpack_policy(weights.clone(), receiver, received_rms)
    obs = torch.randn(7, 6)
    for got, want in zip(receiver(obs), actor(obs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # float64 on the wire: the actor normalises with the learner's very statistics
    assert np.array_equal(received_rms.mean, obs_rms.mean) and np.array_equal(received_rms.var, obs_rms.var)
    assert received_rms.count == obs_rms.count


def three_step_segment(num_steps=7):
    """A segment of 2 ThreeStepPendulum envs (episodes end at t = 2, 5): the actor's statistics,
    the observation it continues from and the segment, after a reset as an actor does it."""
    if "ThreeStepPendulum-v0" not in gym.registry:
        gym.register("ThreeStepPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=3)
    envs = vaco_async.make_envs(vaco_async.Args(env_id="ThreeStepPendulum-v0", num_envs=2), run_name="test")
    layout = vaco_async.SegmentLayout(num_steps=num_steps, num_envs=2, obs_dim=3, act_dim=1)
    segment = layout.views(torch.full((layout.size,), -1.0, dtype=torch.float64))
    obs_rms, actor = vaco_async.RunningMeanStd(shape=(3,)), vaco_async.Actor(3, 1)
    raw_obs, _ = envs.reset(seed=0)
    segment["reset_obs"][:] = raw_obs
    obs_rms.update(raw_obs)
    first = vaco_async.normalize_obs(raw_obs, obs_rms)
    current = vaco_async.collect_rollout(envs, actor, obs_rms, first, segment, torch.Generator().manual_seed(0))
    envs.close()
    return segment, obs_rms, actor, first, current


def test_collect_rollout_keeps_final_observations_episodes_and_statistics():
    segment, obs_rms, actor, first, current = three_step_segment()
    np.testing.assert_array_equal(segment["obs"][0], first)  # normalised, as acted on
    np.testing.assert_array_equal(segment["next_obs"][:2], segment["obs"][1:3])  # inside an episode
    assert not np.allclose(segment["next_obs"][2], segment["obs"][3])  # the episode ended at t = 2...
    np.testing.assert_array_equal(segment["dones"][:, 0], [0, 0, 1, 0, 0, 1, 0])  # ...by its time limit
    assert (segment["terminations"] == 0).all()
    np.testing.assert_array_equal(segment["next_obs"][6], current)  # the observation to continue from
    # both episodes' logged returns are the sums of their rewards (the second one too)
    np.testing.assert_array_equal(segment["episode_lengths"][:, 1], [0, 0, 3, 0, 0, 3, 0])
    np.testing.assert_allclose(segment["episode_returns"][2], segment["rewards"][:3].sum(0), rtol=1e-6)
    np.testing.assert_allclose(segment["episode_returns"][5], segment["rewards"][3:6].sum(0), rtol=1e-6)
    # the statistics took every observation a step returned (the reset's first), one step at a time
    replay = vaco_async.RunningMeanStd(shape=(3,))
    for raw_obs in [segment["reset_obs"]] + list(segment["raw_obs"]):
        replay.update(raw_obs)
    assert replay.count == obs_rms.count == pytest.approx(2 * 8, abs=1e-3)
    assert np.array_equal(replay.mean, obs_rms.mean) and np.array_equal(replay.var, obs_rms.var)
    # behaviour log-probs are those of the actor on the observations as stored
    mean, logstd = actor(torch.as_tensor(segment["obs"], dtype=torch.float32))
    torch.testing.assert_close(torch.as_tensor(segment["behaviour_logprobs"], dtype=torch.float32),
                               vaco_async.gaussian_logprob(torch.as_tensor(segment["actions"], dtype=torch.float32),
                                                           mean, logstd).detach())


def test_the_learner_absorbs_exactly_what_the_actor_saw():
    segment, obs_rms, _, _, _ = three_step_segment()
    for field, value in dict(rank=1, index=0, version=0, wait_time=0.5, run_time=2.0).items():
        segment[field][:] = value  # actor 1's first segment: the envs were just reset
    learner_rms, rng_states, actor_stats = vaco_async.RunningMeanStd(shape=(3,)), {}, {}
    raw_rewards = segment["rewards"].copy()
    episodes = vaco_async.absorb_segment(segment, vaco_async.RewardScaler(2, 0.99), learner_rms, rng_states, actor_stats)
    # one actor: the learner's statistics are the actor's, bit for bit (the next version carries them back)
    assert np.array_equal(learner_rms.mean, obs_rms.mean) and learner_rms.count == obs_rms.count
    assert np.array_equal(learner_rms.var, obs_rms.var)
    reference = vaco_async.RewardScaler(2, 0.99)  # the rewards, scaled as the synchronous script does
    np.testing.assert_array_equal(segment["rewards"], [reference(r, d) for r, d in zip(raw_rewards, segment["dones"] > 0)])
    # episodes in step order, each with the step of the segment it ended at (envs 0 and 1 end together)
    assert [(length, step) for _, length, step in episodes] == [(3, 2), (3, 2), (3, 5), (3, 5)]
    assert actor_stats[1] == dict(steps=14, wait_fraction=0.25) and rng_states[1].dtype == torch.uint8


def test_reward_scaler_on_slices_of_envs_keeps_one_set_of_statistics():
    # the learner scales each actor's envs (a slice) with one set of return statistics
    rng = np.random.default_rng(0)
    rewards, dones = rng.normal(size=(50, 4)), rng.random((50, 4)) < 0.1
    whole, split = vaco_async.RewardScaler(4, 0.99), vaco_async.RewardScaler(4, 0.99)
    for r, d in zip(rewards, dones):
        whole(r, d)
        split(r[:2], d[:2], slice(0, 2))
        scaled = split(r[2:], d[2:], slice(2, 4))
        np.testing.assert_allclose(scaled, np.clip(r[2:] / np.sqrt(split.return_rms.var + 1e-8), -10, 10))
    np.testing.assert_allclose(split.returns, whole.returns)  # each env's discounted return, reset at dones
    assert split.return_rms.count == pytest.approx(whole.return_rms.count)
    np.testing.assert_allclose(split.return_rms.mean, whole.return_rms.mean, rtol=1e-9)
    np.testing.assert_allclose(split.return_rms.var, whole.return_rms.var, rtol=1e-9)


# --- launch and bad input -----------------------------------------------------------------------

def test_torchrun_world_size_sets_or_checks_the_actors(monkeypatch):
    for name, value in dict(TORCHELASTIC_RUN_ID="test", RANK="2", WORLD_SIZE="4").items():
        monkeypatch.setenv(name, value)
    args = vaco_async.Args()
    assert vaco_async.resolve_launch(args) == (2, 4, True) and args.num_actors == 3
    with pytest.raises(SystemExit, match=r"torchrun started 4 processes, but --num-actors 2 needs 3"):
        vaco_async.resolve_launch(vaco_async.Args(num_actors=2))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit, match="needs at least 1 actor"):
        vaco_async.resolve_launch(vaco_async.Args())


BAD_INPUTS = [
    (dict(num_actors=0), "--num-actors must be in [1, inf), got 0"),
    (dict(num_actors=3), "--num-envs 2 cannot be split evenly across 3 actors"),
    (dict(max_policy_lag=-1), "--max-policy-lag must be in [0, inf), got -1"),
    (dict(queue_batches=0), "--queue-batches must be in [1, inf), got 0"),
    (dict(actor_timeout=0.0), "--actor-timeout must be in (0, inf), got 0.0"),
    (dict(total_timesteps=32), "--total-timesteps 32 leaves less than a batch (64) to train"),
    (dict(env_id="CartPole-v1"), "CartPole-v1 has a Discrete action space"),
    (dict(resume="missing.cleanrl_model"), "missing.cleanrl_model: no such file"),
    (dict(num_minibatches=64, num_steps=32), "a minibatch of 1 sample cannot normalise its advantages"),
    (dict(exp_name="../elsewhere"), "--exp-name names the run's folder: a plain name, not '../elsewhere'"),
]


@pytest.mark.floatfree
@pytest.mark.parametrize("overrides, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_clear_error(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:  # before any process starts or any log is written
        vaco_async.main(vaco_async.Args(**{**TINY, **overrides}))
    assert str(exc.value).startswith("error: ") and message in str(exc.value)
    assert not os.path.exists("runs")


@pytest.mark.floatfree
def test_port_in_use_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    busy = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    with pytest.raises(SystemExit, match=f"cannot listen on 127.0.0.1:{busy.port}: the port is in use"):
        vaco_async.main(vaco_async.Args(**TINY, master_port=busy.port))


# --- real runs: the learner and its actor processes ----------------------------------------------

def tagged_processes(tag):
    """Processes whose environment holds `tag`: a launcher and everything it started, orphans too."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(pid))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def children(pid, name):
    """Processes started by `pid` whose command line contains `name`."""
    found = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and name in cmdline:
            found.append(int(child))
    return sorted(found)


class Launched:
    """A command started in its own session, its output going to files."""

    def __init__(self, command, cwd, env, name):
        self.out_path, self.err_path = cwd / f"{name}.out", cwd / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)

    def output(self):
        return self.out_path.read_text(), self.err_path.read_text()

    def wait_for(self, pattern, timeout):
        """Block until stdout matches `pattern` (the process must still run)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.output()[0]):
                return
            if self.proc.poll() is not None:
                pytest.fail(f"exited with {self.proc.returncode} before printing {pattern!r}:\n" + "\n".join(self.output()))
            time.sleep(0.1)
        pytest.fail(f"no {pattern!r} within {timeout} s:\n" + "\n".join(self.output()))

    def finish(self, timeout):
        """(exit code, stdout, stderr); kills the session and fails the test after `timeout` s."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"timed out after {timeout} s:\n" + "\n".join(self.output()))
        return (self.proc.returncode, *self.output())


@contextlib.contextmanager
def launcher(cwd):
    """Yields start(*command) that starts a command in `cwd`. On exit, every process it started,
    orphans included, must be gone within a few seconds (they are killed, and the test fails)."""
    tag = f"VACO_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, "VACO_TEST_TAG": tag.split("=")[1], "PYTHONWARNINGS": "ignore"}
    started = []

    def start(*command, name="run"):
        started.append(Launched(list(command), cwd, env, name))
        return started[-1]

    yield start
    for launched in started:
        if launched.proc.poll() is None:
            os.killpg(launched.proc.pid, signal.SIGKILL)
            launched.proc.wait()
    deadline = time.time() + 10
    while (alive := tagged_processes(tag)) and time.time() < deadline:
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes left alive after the test: {alive}"


@pytest.fixture
def launch(tmp_path):
    """launch(*command) starts a command in tmp_path (see `launcher`)."""
    with launcher(tmp_path) as start:
        yield start


def script(launch, *flags_, name="run"):
    return launch(sys.executable, SCRIPT, *flags_, name=name)


def run_scalars(tmp_path, exp_name="vaco_async"):
    (run_dir,) = glob.glob(f"{tmp_path}/runs/*__{exp_name}__*")
    return run_dir, read_scalars(run_dir)


@pytest.mark.floatfree
def test_two_actors_finish_with_lag_and_a_checkpoint(launch, tmp_path):
    code, out, err = script(launch, *flags(num_actors=2, actor_delay_ms=50, save_model=True,
                                           eval_episodes=1)).finish(timeout=90)
    assert code == 0, out + err
    assert "step 512/512 (100%)" in out and "SPS: " in out and "eval: mean return over 1 episodes" in out
    run_dir, scalars = run_scalars(tmp_path)
    lag_mean, lag_max = scalars["charts/policy_lag_mean"], scalars["charts/policy_lag_max"]
    assert len(lag_mean) == 8 and min(lag_mean) >= 0
    assert lag_max[0] == 0  # the first update uses segments of the initial policy
    assert np.mean(lag_mean) > 0  # then actors act while the learner learns: lag
    assert scalars["charts/segments_used"][-1] == 16 and scalars["charts/segments_dropped"][-1] == 0
    assert scalars["charts/segments_received"][-1] >= 16 and scalars["charts/actors_alive"] == [2] * 8
    for tag in ["charts/learner_wait_fraction", "charts/actor_wait_fraction", "charts/updates_per_second",
                "charts/queue_depth"]:
        assert len(scalars[tag]) == 8 and np.isfinite(scalars[tag]).all(), tag
    for actor in (1, 2):  # logged at every update from the first that used one of its segments (under load
        # an actor that starts late, or that the other outpaces, begins later: how late is the scheduler's)
        sps, waits = scalars[f"actors/actor_{actor}_SPS"], scalars[f"actors/actor_{actor}_wait_fraction"]
        assert len(sps) == len(waits) >= 1 and np.isfinite(sps + waits).all() and min(sps) > 0
    assert scalars["charts/backward_tv"][0] < 1e-6  # version 0 acted and is evaluated: ratio 1
    checkpoint = torch.load(f"{run_dir}/vaco_async.cleanrl_model", weights_only=True)
    assert set(checkpoint) == {"script", "agent", "optimizer", "obs_rms", "reward_rms", "generator",
                               "actor_generators", "global_step", "iteration", "args"}
    assert checkpoint["global_step"] == 512 and checkpoint["iteration"] == 8  # iteration: the learner's version
    assert sorted(checkpoint["actor_generators"]) == [1, 2]
    # every observation either actor saw, once: two resets and all the steps of the segments taken
    received = scalars["charts/segments_received"][-1]
    assert 2 + 512 <= checkpoint["obs_rms"]["count"] <= 2 + 32 * received + 1e-3


def test_sync_with_one_actor_is_vaco_continuous(launch, tmp_path, monkeypatch):
    # the only difference left: acting happens in another process (with weights that are current here)
    settings = dict(num_envs=2, num_steps=64, num_minibatches=4, update_epochs=2, total_timesteps=512, seed=3,
                    learning_rate=3e-3, tv_threshold=0.005)
    code, out, err = script(launch, *flags(sync=True, num_actors=1, **settings)).finish(timeout=90)
    assert code == 0, out + err
    _, asynchronous = run_scalars(tmp_path)
    monkeypatch.chdir(tmp_path)
    import vaco_continuous

    vaco_continuous.main(vaco_continuous.Args(**{**TINY, **settings}, exp_name="sync"))
    _, synchronous = run_scalars(tmp_path, "sync")
    compared = [tag for tag in synchronous if tag.startswith("losses/")] + [
        "charts/episodic_return", "charts/episodic_length", "charts/backward_tv", "charts/rho_clipped_fraction"]
    assert len(compared) > 12 and max(synchronous["losses/filtered_fraction"]) > 0  # the filter acted
    for tag in compared:
        assert asynchronous[tag] == synchronous[tag], tag  # bit for bit


@pytest.mark.floatfree
def test_sync_uses_only_the_current_version_and_repeats_exactly(launch, tmp_path):
    # two runs with the same seed, side by side: --sync is the deterministic baseline
    runs = [script(launch, *flags(num_actors=2, sync=True, exp_name=name), name=name) for name in ("a", "b")]
    for run in runs:
        code, out, err = run.finish(timeout=90)
        assert code == 0, out + err
    (_, a), (_, b) = run_scalars(tmp_path, "a"), run_scalars(tmp_path, "b")
    assert a["charts/policy_lag_max"] == [0] * 8
    assert max(a["charts/backward_tv"]) < 1e-6  # the behaviour policy is the learner's
    assert a["charts/segments_received"][-1] == a["charts/segments_used"][-1] == 16
    for tag in ["charts/episodic_return", "losses/value_loss", "losses/policy_loss"]:
        assert a[tag] == b[tag], tag


@pytest.mark.floatfree
def test_max_policy_lag_0_drops_old_segments(launch, tmp_path):
    # one actor: while the learner trains on its segment, it acts on with the same version
    code, out, err = script(launch, *flags(num_actors=1, max_policy_lag=0)).finish(timeout=90)
    assert code == 0, out + err
    _, scalars = run_scalars(tmp_path)
    assert set(scalars["charts/policy_lag_max"]) == {0}
    used, dropped = map(int, re.search(r"segments: (\d+) used, (\d+) dropped", out).groups())
    # a segment is a whole batch here (2 envs x 32 steps); the budget counts the segments used
    assert dropped > 0 and used == len(scalars["charts/policy_lag_max"]) == 512 // 64
    assert "step 512/512 (100%)" in out


@pytest.mark.floatfree
def test_torchrun_standalone(launch, tmp_path):
    code, out, err = launch(*TORCHRUN, "--standalone", "--nproc-per-node", "3", SCRIPT, *flags()).finish(timeout=90)
    assert code == 0, out + err
    assert "learner: 2 actor(s) joined" in out and "step 512/512 (100%)" in out
    _, scalars = run_scalars(tmp_path)
    assert scalars["charts/actors_alive"][-1] == 2


@pytest.mark.floatfree
def test_torchrun_two_nodes_on_loopback(launch, tmp_path):
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nodes = [launch(*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", SCRIPT, *flags(),
                    name=f"node{node}") for node in (0, 1)]
    results = [node.finish(timeout=90) for node in nodes]
    assert [code for code, _, _ in results] == [0, 0], results
    assert sum("step 512/512 (100%)" in out for _, out, _ in results) == 1  # one learner, on either node


def kill_one_of_two_actors(run, attempt):
    """SIGKILL actor 1 or 2 (by `attempt`) a few updates in, at a different moment each attempt."""
    run.wait_for("actor\\(s\\) joined", timeout=60)
    time.sleep(1.0 + 0.3 * attempt)
    os.kill(children(run.proc.pid, "spawn_main")[attempt % 2], signal.SIGKILL)


@pytest.mark.floatfree
@pytest.mark.parametrize("attempt", range(4))
def test_a_killed_actor_is_lost_and_the_run_goes_on_every_time(launch, tmp_path, attempt):
    # the documented outcome, every time: the killed actor's closed connection, whenever it
    # reaches the learner's receive, does not stop the run; the other actor carries it to the end.
    # The delay (actor r: 25 r ms per segment) keeps both actors acting for more than 3 s on any CPU,
    # past the last kill (1.9 s after they joined)
    run = script(launch, *flags(num_actors=2, total_timesteps=64 * 80, actor_delay_ms=25))
    kill_one_of_two_actors(run, attempt)
    code, out, err = run.finish(timeout=90)
    assert code == 0, out + err
    assert re.search(r"actor \d lost: its process exited with code -9", out) and "step 5120/5120 (100%)" in out
    _, scalars = run_scalars(tmp_path)
    assert scalars["charts/actors_alive"][-1] == 1


@pytest.mark.floatfree
@pytest.mark.parametrize("attempt", range(4))
def test_an_actor_lost_under_sync_stops_the_run_at_once_every_time(launch, tmp_path, attempt):
    # --sync needs every actor: the learner checkpoints and exits 1, and tells the other actor, which
    # waits for its answer, to stop, at once (not after --actor-timeout or gloo's timeout) and
    # whichever the learner notices first: the process's exit or a send to it that fails
    run = script(launch, *flags(num_actors=2, sync=True, total_timesteps=64 * 4000, actor_timeout=60))
    kill_one_of_two_actors(run, attempt)
    killed_at = time.time()
    code, out, err = run.finish(timeout=50)
    assert code == 1, out + err
    assert time.time() - killed_at < 15, out + err
    assert re.search(r"actor \d lost: ", out)
    assert "lost (--sync needs every actor); continue with: python vaco_async.py --resume " in err
    assert "killed" not in err and glob.glob(f"{tmp_path}/runs/*/vaco_async.cleanrl_model")


@pytest.mark.floatfree
def test_a_healthy_actor_takes_its_start_up_message_though_another_is_killed_every_time():
    # actor 1 is killed as soon as the learner's hand-out returns, while actor 3 is slow to take its
    # message: with the point-to-point hand-out actor 3 never needs actor 1. (gloo's broadcast, used
    # before, relayed actor 3's message through actor 1 and lost it in 2 of 8 such trials.)
    from benchmark.asynchrony import gloo_startup_race

    for _ in range(3):
        assert gloo_startup_race.trial("p2p") == {0: "ok", 2: "ok", 3: "ok"}


def test_a_loss_the_communication_thread_finds_is_reported_once():
    comm = vaco_async.LearnerComm([1, 2], vaco_async.SegmentLayout(2, 1, 3, 1), 2, True, 0, torch.zeros(1))
    comm.lost[2] = "connection lost (Connection closed by peer)"  # what a failed send to actor 2 records
    assert comm.watch({}, timeout=60) == {2: "connection lost (Connection closed by peer)"}
    assert comm.watch({}, timeout=60) == {} and comm.live() == [1]


def test_a_process_that_exited_is_reported_by_its_exit_though_a_send_to_it_failed_first():
    # a killed actor's closed connection can fail the reply to its last segment before the learner
    # looks at its process: the report still names the exit (a code -9 is a kill, an OOM killer's too)
    comm = vaco_async.LearnerComm([1, 2, 3], vaco_async.SegmentLayout(2, 1, 3, 1), 2, False, 0, torch.zeros(1))
    comm.lost[2] = comm.lost[3] = "connection lost (Connection closed by peer)"
    processes = {actor: types.SimpleNamespace(exitcode=code) for actor, code in ((1, None), (2, -9), (3, None))}
    assert comm.watch(processes, timeout=60) == {2: "its process exited with code -9",
                                                 3: "connection lost (Connection closed by peer)"}
    assert comm.lost[2] == "its process exited with code -9" and comm.live() == [1]
    processes[1].exitcode = 1
    assert comm.watch(processes, timeout=60) == {1: "its process exited with code 1"} and comm.live() == []


def test_a_send_is_waited_on_once_when_both_threads_answer(monkeypatch):
    # gloo's second wait on a finished send blocks until the group's timeout: the training loop's
    # STOP (which first waits the actor's previous sends) and the communication thread's last waits
    # must never wait the same send, whatever their interleaving
    works, waits, gate = [], collections.Counter(), threading.Event()

    class Work:
        def __init__(self):
            self.id = len(works)
            works.append(self)

        def wait(self):
            waits[self.id] += 1
            if self.id == 0:  # the first reply's send is slow to finish
                gate.wait(5)

    monkeypatch.setattr(vaco_async.dist, "isend", lambda *args, **kwargs: Work())
    comm = vaco_async.LearnerComm([1], vaco_async.SegmentLayout(2, 1, 3, 1), 2, False, 0, torch.zeros(1))
    comm.reply(1)  # the initial policy (send 0)
    comm.unanswered.add(1)  # its segment arrived
    stopping = threading.Thread(target=comm.stop)
    stopping.start()
    time.sleep(0.2)  # the STOP answer now waits on send 0
    comm.wait_told()  # the communication thread's last waits, meanwhile
    gate.set()
    stopping.join(5)
    comm.wait_told()
    assert len(works) == 2 and max(waits.values()) == 1 and comm.told == {1} and comm.stopped == {1}


@pytest.mark.floatfree
def test_a_silent_actor_is_dismissed_and_the_run_goes_on(launch, tmp_path):
    # the delay (actor r: 20 r ms per segment) makes the run outlast the timeout
    run = script(launch, *flags(num_actors=3, num_envs=3, num_minibatches=3, total_timesteps=96 * 20,
                                actor_timeout=2, actor_delay_ms=20))
    run.wait_for("actor\\(s\\) joined", timeout=60)
    killed, stopped, _ = children(run.proc.pid, "spawn_main")
    os.kill(killed, signal.SIGKILL)
    os.kill(stopped, signal.SIGSTOP)  # silent from now on; the learner kills it when it exits
    run.wait_for(r"actor \d lost: its process exited with code -9", timeout=5)
    run.wait_for(r"actor \d lost: silent for more than --actor-timeout 2 s", timeout=2 + 5)
    os.kill(stopped, signal.SIGCONT)  # back, it sends a segment: the learner dismisses it
    code, out, err = run.finish(timeout=90)
    assert code == 0, out + err
    assert "step 1920/1920 (100%)" in out
    assert re.search(r"actor \d: the learner counted this actor lost and carries on without it", err)
    _, scalars = run_scalars(tmp_path)
    alive = scalars["charts/actors_alive"]
    assert alive[-1] == 1 and alive.count(1) > 1  # it carried on with the last actor


@pytest.mark.floatfree
def test_long_updates_do_not_make_healthy_actors_silent(launch, tmp_path):
    # every update (16 minibatches x 90 epochs, eager: about 3 s here, so > 1 s on a CPU 2-3 times faster)
    # outlasts --actor-timeout, while the actors' next segments wait for the full queue: that wait is the
    # learner's, not the actors' silence
    run = script(launch, *flags(num_actors=2, num_minibatches=16, update_epochs=90, total_timesteps=64 * 4,
                                actor_timeout=1))
    code, out, err = run.finish(timeout=120)
    assert code == 0, out + err
    assert " lost: " not in out and "step 256/256 (100%)" in out
    _, scalars = run_scalars(tmp_path)
    assert scalars["charts/actors_alive"] == [2] * 4
    assert min(np.diff([0] + event_wall_times(tmp_path, "charts/SPS"))[1:]) > 1.0  # updates did take > 1 s


@pytest.mark.floatfree
def test_no_data_at_all_checkpoints_and_exits_non_zero(launch, tmp_path):
    run = script(launch, *flags(num_actors=1, total_timesteps=100_000, actor_timeout=3))
    run.wait_for("actor\\(s\\) joined", timeout=60)
    (actor,) = children(run.proc.pid, "spawn_main")
    os.kill(actor, signal.SIGSTOP)
    code, out, err = run.finish(timeout=60)
    assert code == 1
    assert "actor 1 lost: silent for more than --actor-timeout 3 s" in out
    assert re.search(r"error: stopped at step \d+, update \d+: no actor left", err)
    (path,) = glob.glob(f"{tmp_path}/runs/*/vaco_async.cleanrl_model")
    assert torch.load(path, weights_only=True)["global_step"] < 100_000


def environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)


@pytest.mark.floatfree
def test_actors_leave_when_their_learner_is_killed_at_any_moment(launch, tmp_path):
    # kill -9 of the learner at 5 random moments from its actors' spawn (just after "run folder:"): while they start
    # Python, connect to its store, join the group, take their settings, act. Every time every actor is gone within
    # --actor-timeout of the kill, having said one line, no traceback. (Until actors watched their learner, those it
    # left before they joined waited out gloo's timeout, 20 minutes, then printed 40 lines of C++ stack frames each.)
    # An actor leaves as soon as its Python is up: with the study running on both cores of a 2-core machine that
    # took up to 8 s after its spawn, so the timeout is 20 s. The moments are drawn from 5 successive 1 s intervals
    timeout = 20
    for attempt, delay in enumerate(random.uniform(i, i + 1) for i in range(5)):
        name = f"attempt{attempt}"
        run = script(launch, *flags(num_actors=2, total_timesteps=10**6, actor_timeout=timeout, exp_name=name,
                                    env_id="Hopper-v5"), name=name)  # v5: no warning that it is out of date
        run.wait_for("run folder: ", timeout=60)  # the actors are spawned right after it
        tag = environment(run.proc.pid)[b"VACO_TEST_TAG"].decode()
        time.sleep(delay)
        seen = children(run.proc.pid, "spawn_main")  # the actors that are up
        os.kill(run.proc.pid, signal.SIGKILL)
        killed_at = time.time()
        run.proc.wait()
        while (left := tagged_processes(tag)) and time.time() < killed_at + timeout:
            time.sleep(0.1)
        out, err = run.output()
        assert not left, f"{left} alive {timeout} s after their learner was killed {delay:.2f} s in:\n{out}{err}"
        lines = err.strip().splitlines()
        said = [re.fullmatch(rf"error: actor (\d) stopped: its learner \(process {run.proc.pid}\) is gone", line)
                for line in lines]
        assert all(said) and len(lines) >= len(seen), f"killed {delay:.2f} s in:\n{err}"
        assert len({match.group(1) for match in said}) == len(lines)  # one line each


@pytest.mark.floatfree
def test_a_diverged_run_stops_keeping_its_finite_checkpoints(launch, tmp_path):
    # a learning rate of 10 makes the loss NaN within a few updates: the run stops after that update with one
    # line, saves no checkpoint of its weights (nor sends them to the actor), and keeps those of the updates before
    run = script(launch, *flags(num_actors=1, sync=True, learning_rate=10, save_model=True, checkpoint_every=1))
    code, out, err = run.finish(timeout=90)
    assert code == 1 and "Traceback" not in err, out + err
    (run_dir,) = glob.glob(f"{tmp_path}/runs/*")
    last = re.fullmatch(r"error: update (\d+) made the \S+ NaN or infinite: the run stopped \(its checkpoints before "
                        rf"it, if any: runs/{os.path.basename(run_dir)}\)", err.strip().splitlines()[-1])
    assert last, err
    saved = sorted(glob.glob(f"{run_dir}/*.cleanrl_model"), key=os.path.getmtime)
    assert [os.path.basename(path) for path in saved] == [f"vaco_async_step{64 * update}.cleanrl_model"
                                                          for update in range(1, int(last.group(1)))]
    for path in saved:
        assert all(torch.isfinite(value).all() for value in torch.load(path, weights_only=True)["agent"].values())


@pytest.mark.floatfree
def test_sigint_checkpoints_and_resume_continues(launch, tmp_path):
    run = script(launch, *flags(num_actors=1, total_timesteps=1_000_000, exp_name="first"), name="first")
    run.wait_for(r"step \d+/", timeout=60)  # a few updates
    run.proc.send_signal(signal.SIGINT)  # to the launcher only, as `kill -INT`
    code, out, err = run.finish(timeout=60)
    assert code == 128 + signal.SIGINT, out + err
    (path,) = glob.glob(f"{tmp_path}/runs/*__first__*/first.cleanrl_model")
    checkpoint = torch.load(path, weights_only=True)
    step, version = checkpoint["global_step"], checkpoint["iteration"]
    assert step > 0 and version > 0 and step == 64 * version
    assert out.strip().splitlines()[-1] == \
        f"stopped at step {step}; continue with: python vaco_async.py --resume {os.path.relpath(path, tmp_path)}"

    total = step + 128
    code, out, err = script(launch, *flags(num_actors=1, total_timesteps=total, exp_name="resumed", resume=path,
                                           save_model=True, eval_episodes=1), name="resumed").finish(timeout=90)
    assert code == 0, out + err
    assert f"resumed from {path} at step {step} (update {version})" in out
    run_dir, scalars = run_scalars(tmp_path, "resumed")
    assert scalars["charts/SPS"] and min(event_steps(run_dir, "charts/SPS")) > step
    resumed = torch.load(f"{run_dir}/resumed.cleanrl_model", weights_only=True)
    assert resumed["global_step"] == total and resumed["iteration"] == version + 2
    # the optimiser, the statistics and the actor's noise carried on (4 minibatches x 2 epochs per update)
    assert resumed["optimizer"]["step"].item() == 8 * (version + 2)
    assert resumed["obs_rms"]["count"] >= checkpoint["obs_rms"]["count"] + 1 + 128
    assert not torch.equal(resumed["actor_generators"][1], checkpoint["actor_generators"][1])


FIRST = dict(num_envs=4, num_actors=2, num_steps=32, total_timesteps=512, save_model=True, eval_episodes=0)


@pytest.fixture(scope="module")
def first_checkpoint(tmp_path_factory):
    """The checkpoint of one finished run with the FIRST settings, trained once for the tests that resume it."""
    cwd = tmp_path_factory.mktemp("first")
    with launcher(cwd) as launch:
        code, out, err = script(launch, *flags(**FIRST, exp_name="first"), name="first").finish(timeout=90)
    assert code == 0, out + err
    (path,) = glob.glob(f"{cwd}/runs/*__first__*/first.cleanrl_model")
    return path


@pytest.mark.floatfree
@pytest.mark.parametrize("changed", [dict(num_envs=6, num_actors=2), dict(num_envs=3, num_actors=3),
                                     dict(num_steps=48)], ids=["num-envs", "num-actors", "num-steps"])
def test_resume_with_another_segment_size_ends_at_its_budget(launch, tmp_path, first_checkpoint, changed):
    settings = {**FIRST, **changed, "total_timesteps": 1300}
    batch = settings["num_envs"] * settings["num_steps"]
    code, out, err = script(launch, *flags(**settings, resume=first_checkpoint, exp_name="resumed"),
                            name="resumed").finish(timeout=90)
    assert code == 0, out + err
    end = 512 + (1300 - 512) // batch * batch  # the whole batches that fit
    assert f"step {end}/{end} (100%)" in out
    assert torch.load(glob.glob(f"{tmp_path}/runs/*__resumed__*/resumed.cleanrl_model")[0],
                      weights_only=True)["global_step"] == end


@pytest.mark.floatfree
def test_a_resumed_run_takes_its_settings_from_its_checkpoint(launch, tmp_path, first_checkpoint):
    # only the length, the name and how long an actor may be silent on the command line: the layout (4 envs, 2
    # actors, segments of 32 steps), --save-model and the rest come from the checkpoint
    command = ["--resume", first_checkpoint, "--total-timesteps", "1300", "--exp-name", "resumed",
               "--actor-timeout", "30"]
    code, out, err = script(launch, *command, name="resumed").finish(timeout=90)
    assert code == 0, out + err
    assert out.startswith("note: the run trains to step 1280, the last whole batch of 128 within --total-timesteps "
                          "1300\n") and "learner: 2 actor(s) joined" in out and "step 1280/1280 (100%)" in out
    (path,) = glob.glob(f"{tmp_path}/runs/*__resumed__*/resumed.cleanrl_model")
    saved = torch.load(path, weights_only=True)["args"]
    assert [saved[name] for name in ("num_envs", "num_actors", "num_steps", "compile", "actor_timeout")] == \
        [4, 2, 32, False, 30.0]


# options a resumed run refuses to change: the lag's settings, which change the data it trains on, like the method's
REFUSED = [("sync", True, "--sync True differs from False"),
           ("queue_batches", 2, "--queue-batches 2 differs from 1"),
           ("actor_delay_ms", 5.0, "--actor-delay-ms 5.0 differs from 0.0"),
           ("max_policy_lag", 0, "--max-policy-lag 0 differs from None"),
           ("gamma", 0.9, "--gamma 0.9 differs from 0.99"),
           ("env_id", "Ant-v4", "--env-id Ant-v4 differs from Hopper-v4")]


@pytest.mark.floatfree
@pytest.mark.parametrize("option, value, message", REFUSED, ids=[option for option, _, _ in REFUSED])
def test_a_resumed_run_refuses_an_option_that_changes_the_run(option, value, message, first_checkpoint, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        vaco_async.main(vaco_async.Args(**{**TINY, "total_timesteps": 1300, "resume": first_checkpoint, option: value}))
    assert str(exc.value) == (f"error: {message}, the value {first_checkpoint} was trained with: a resumed run keeps "
                              "its own settings (leave the option out)")
    assert not os.path.exists("runs")


def nothing_starts(monkeypatch):
    """Make building an env, opening the learner's store or starting a process fail the test."""
    for module, name in ((vaco_async.gym, "make"), (vaco_async, "open_store"), (vaco_async.mp, "get_context")):
        monkeypatch.setattr(module, name, lambda *args, **kwargs: pytest.fail(f"{name} was called"))


@pytest.mark.floatfree
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "another script's"])
def test_a_file_not_its_checkpoint_is_one_line_before_any_process(kind, first_checkpoint, tmp_path, monkeypatch):
    path, message = not_ours(kind, vaco_async, first_checkpoint, tmp_path)
    monkeypatch.chdir(tmp_path)
    nothing_starts(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        vaco_async.main(vaco_async.Args(**TINY, resume=path))
    assert str(exc.value) == f"error: {path}: {message}"
    assert not os.path.exists("runs")


@pytest.mark.floatfree
def test_another_script_s_checkpoint_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vaco_continuous.main(vaco_continuous.Args(**{**TINY, "total_timesteps": 128}, exp_name="sync", save_model=True,
                                              eval_episodes=0))
    (path,) = glob.glob(f"{tmp_path}/runs/*__sync__*/sync.cleanrl_model")
    nothing_starts(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        vaco_async.main(vaco_async.Args(**TINY, resume=path))
    assert str(exc.value) == f"error: {path}: not a checkpoint of vaco_async.py but of vaco_continuous.py"


@pytest.mark.floatfree
def test_a_dismissed_actor_under_torchrun_exits_0_and_the_run_goes_on(launch, tmp_path):
    # torchrun stops every worker when one exits non-zero: a dismissed actor must not
    run = launch(*TORCHRUN, "--standalone", "--nproc-per-node", "3", SCRIPT,
                 *flags(total_timesteps=64 * 200, actor_timeout=2, actor_delay_ms=20))
    run.wait_for("actor\\(s\\) joined", timeout=60)
    ranks = {worker_rank(pid): pid for pid in children(run.proc.pid, "vaco_async.py")}
    assert sorted(ranks) == [0, 1, 2]
    os.kill(ranks[2], signal.SIGSTOP)
    run.wait_for(r"actor 2 lost: silent for more than --actor-timeout 2 s", timeout=15)
    os.kill(ranks[2], signal.SIGCONT)  # it sends its segment, is dismissed, and exits 0
    code, out, err = run.finish(timeout=90)
    assert code == 0, out + err
    assert "step 12800/12800 (100%)" in out and "actor 2: the learner counted this actor lost" in err


def worker_rank(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return int(dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)[b"RANK"])


def event_wall_times(tmp_path, tag, exp_name="vaco_async"):
    (run_dir,) = glob.glob(f"{tmp_path}/runs/*__{exp_name}__*")
    return read_scalars(run_dir, "wall_time")[tag]


def event_steps(run_dir, tag):
    return read_scalars(run_dir, "step")[tag]


@pytest.mark.floatfree
def test_bad_input_from_the_command_line(launch, tmp_path):
    path = tmp_path / "tampered.cleanrl_model"
    torch.save({"agent": Payload()}, path)  # unpickling it would print
    code, out, err = script(launch, *flags(resume=path)).finish(timeout=60)
    assert code != 0 and "Traceback" not in err and "this ran" not in out + err
    assert err.strip().splitlines()[-1].startswith(f"error: refusing to load {path}")
    assert not os.path.exists(tmp_path / "runs")
