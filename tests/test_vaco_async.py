"""vaco_async.py: messages, checkpoints and launch checks in-process; then real runs of the learner
and its actor processes (spawned, and under torchrun), each in its own session with a hard timeout,
after which no process it started may be alive."""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import gymnasium as gym
import numpy as np
import pytest
import torch

import vaco_async
from conftest import ROOT, read_scalars
from test_continuous import Payload

SCRIPT = os.path.join(ROOT, "vaco_async.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, of this Python
# A few seconds of training: updates of 2 envs x 32 steps in all (so 2 actors send 1 env x 32 steps each).
TINY = dict(env_id="Hopper-v4", num_envs=2, num_steps=32, num_minibatches=4, update_epochs=2, total_timesteps=512)


def flags(**overrides):
    """Command-line flags of TINY with `overrides` (True: a bare switch)."""
    out = []
    for key, value in {**TINY, **overrides}.items():
        out += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return out


# --- messages -----------------------------------------------------------------------------------

def test_segment_fields_view_one_message_without_overlap():
    layout = vaco_async.SegmentLayout(num_steps=5, num_envs=3, obs_dim=4, act_dim=2)
    message = torch.zeros(layout.size)
    fields = layout.views(message)
    assert layout.size == 6 + 2 * 5 * 3 * 4 + 5 * 3 * 2 + 6 * 5 * 3 and layout.steps == 15
    for value, (name, array) in enumerate(fields.items(), start=1):
        assert array.shape == layout.shapes[name]
        array[...] = value  # each field writes its own part of the message, and only that
    counts = torch.bincount(message.long())
    assert counts[0] == 0 and [counts[v].item() for v in range(1, len(fields) + 1)] == [
        int(np.prod(shape)) for shape in layout.shapes.values()]
    assert vaco_async.SegmentLayout(5, 3, 4, 2).size == layout.size  # sender and receiver agree


def test_policy_round_trip_carries_weights_and_statistics():
    actor, receiver = vaco_async.Actor(6, 2), vaco_async.Actor(6, 2)
    obs_rms = vaco_async.RunningMeanStd((6,))
    obs_rms.update(np.random.default_rng(0).normal(3.0, 2.0, size=(100, 6)))
    weights = vaco_async.pack_policy(actor, obs_rms)
    assert weights.dtype == torch.float32 and weights.ndim == 1
    parameters, received_rms = vaco_async.unpack_policy(weights, obs_dim=6)
    torch.nn.utils.vector_to_parameters(parameters, receiver.parameters())
    obs = torch.randn(7, 6)
    for got, want in zip(receiver(obs), actor(obs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    np.testing.assert_allclose(received_rms.mean, obs_rms.mean, rtol=1e-6)  # float32 on the wire
    np.testing.assert_allclose(received_rms.var, obs_rms.var, rtol=1e-6)
    assert not np.array_equal(received_rms.mean, obs_rms.mean)  # ...rounded, so both sides use the sent copy


def test_collect_segment_keeps_final_observations_and_episodes():
    if "ThreeStepPendulum-v0" not in gym.registry:
        gym.register("ThreeStepPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=3)
    args = vaco_async.Args(env_id="ThreeStepPendulum-v0", num_envs=2)
    envs = vaco_async.make_envs(args, run_name="test")
    layout = vaco_async.SegmentLayout(num_steps=4, num_envs=2, obs_dim=3, act_dim=1)
    segment = layout.views(torch.full((layout.size,), -1.0))
    raw_obs, _ = envs.reset(seed=0)
    first = raw_obs.copy()
    actor = vaco_async.Actor(3, 1)
    raw_obs = vaco_async.collect_segment(envs, actor, vaco_async.RunningMeanStd((3,)), raw_obs, segment,
                                         torch.Generator().manual_seed(0))
    envs.close()
    np.testing.assert_array_equal(segment["obs"][0], first)  # raw, not normalised
    np.testing.assert_array_equal(segment["next_obs"][:2], segment["obs"][1:3])  # inside an episode
    assert not np.allclose(segment["next_obs"][2], segment["obs"][3])  # the episode ended at t = 2...
    np.testing.assert_array_equal(segment["truncations"][:, 0], [0, 0, 1, 0])  # ...by its time limit
    assert (segment["terminations"] == 0).all()
    np.testing.assert_array_equal(segment["next_obs"][3], raw_obs)  # the observation to continue from
    np.testing.assert_array_equal(segment["episode_lengths"][:, 1], [0, 0, 3, 0])
    np.testing.assert_allclose(segment["episode_returns"][2], segment["rewards"][:3].sum(0), rtol=1e-5)
    # behaviour log-probs are those of the actor on the normalised observations
    mean, logstd = actor(torch.as_tensor(segment["obs"]))
    torch.testing.assert_close(torch.as_tensor(segment["logprobs"]),
                               vaco_async.gaussian_logprob(torch.as_tensor(segment["actions"]), mean, logstd).detach())


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
    (dict(num_actors=0), "--num-actors must be >= 1, got 0"),
    (dict(num_actors=3), "--num-envs 2 cannot be split evenly across 3 actors"),
    (dict(max_policy_lag=-1), "--max-policy-lag must be >= 0"),
    (dict(queue_batches=0), "--queue-batches must be >= 1"),
    (dict(actor_timeout=0.0), "--actor-timeout must be positive"),
    (dict(total_timesteps=32), "less than one batch"),
    (dict(env_id="CartPole-v1"), "CartPole-v1 has a Discrete action space"),
    (dict(resume="missing.cleanrl_model"), "--resume missing.cleanrl_model: no such file"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_clear_error(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:  # before any process starts or any log is written
        vaco_async.main(vaco_async.Args(**{**TINY, **overrides}))
    assert str(exc.value).startswith("error: ") and message in str(exc.value)
    assert not os.path.exists("runs")


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


@pytest.fixture
def launch(tmp_path):
    """launch(*command) starts a command in tmp_path. After the test, every process it started,
    orphans included, must be gone within a few seconds (they are killed, and the test fails)."""
    tag = f"VACO_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, "VACO_TEST_TAG": tag.split("=")[1], "PYTHONWARNINGS": "ignore"}
    started = []

    def start(*command, name="run"):
        started.append(Launched(list(command), tmp_path, env, name))
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


def script(launch, *flags_, name="run"):
    return launch(sys.executable, SCRIPT, *flags_, name=name)


def run_scalars(tmp_path, exp_name="vaco_async"):
    (run_dir,) = glob.glob(f"{tmp_path}/runs/*__{exp_name}__*")
    return run_dir, read_scalars(run_dir)


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
    for actor in (1, 2):  # from the first update it contributed to (the slower one may miss the first)
        assert 7 <= len(scalars[f"actors/actor_{actor}_SPS"]) == len(scalars[f"actors/actor_{actor}_wait_fraction"])
    assert scalars["charts/backward_tv"][0] < 1e-6  # version 0 acted and is evaluated: ratio 1
    checkpoint = torch.load(f"{run_dir}/vaco_async.cleanrl_model", weights_only=True)
    assert set(checkpoint) == {"agent", "optimizer", "obs_rms", "reward_rms", "generator", "global_step",
                               "iteration", "args"}
    assert checkpoint["global_step"] == 512 and checkpoint["iteration"] == 8  # iteration: the learner's version
    assert checkpoint["obs_rms"]["count"] == pytest.approx(512, abs=1e-3)  # the observations of 8 batches


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


def test_max_policy_lag_0_drops_old_segments(launch, tmp_path):
    # one actor: while the learner trains on its segment, it acts on with the same version
    code, out, err = script(launch, *flags(num_actors=1, max_policy_lag=0)).finish(timeout=90)
    assert code == 0, out + err
    _, scalars = run_scalars(tmp_path)
    assert set(scalars["charts/policy_lag_max"]) == {0}
    assert scalars["charts/segments_dropped"][-1] > 0
    used, dropped = map(int, re.search(r"segments: (\d+) used, (\d+) dropped", out).groups())
    # a segment is a whole batch here (2 envs x 32 steps); every step taken is used or dropped
    assert used == len(scalars["charts/policy_lag_max"]) and (used + dropped) * 64 == 512


def test_torchrun_standalone(launch, tmp_path):
    code, out, err = launch(*TORCHRUN, "--standalone", "--nproc-per-node", "3", SCRIPT, *flags()).finish(timeout=90)
    assert code == 0, out + err
    assert "learner: 2 actor(s) joined" in out and "step 512/512 (100%)" in out
    _, scalars = run_scalars(tmp_path)
    assert scalars["charts/actors_alive"][-1] == 2


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


def test_lost_actors_are_counted_and_the_run_goes_on(launch, tmp_path):
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
    assert re.search(r"actor \d: the learner had counted this actor lost and dismissed it", err)
    _, scalars = run_scalars(tmp_path)
    alive = scalars["charts/actors_alive"]
    assert alive[-1] == 1 and alive.count(1) > 1  # it carried on with the last actor


def test_no_data_at_all_checkpoints_and_exits_non_zero(launch, tmp_path):
    run = script(launch, *flags(num_actors=1, total_timesteps=100_000, actor_timeout=3))
    run.wait_for("actor\\(s\\) joined", timeout=60)
    (actor,) = children(run.proc.pid, "spawn_main")
    os.kill(actor, signal.SIGSTOP)
    code, out, err = run.finish(timeout=60)
    assert code == 1
    assert "actor 1 lost: silent for more than --actor-timeout 3 s" in out
    assert re.search(r"error: stopped at step \d+, version \d+: no actor left", err)
    (path,) = glob.glob(f"{tmp_path}/runs/*/vaco_async.cleanrl_model")
    assert torch.load(path, weights_only=True)["global_step"] < 100_000


def test_sigint_checkpoints_and_resume_continues(launch, tmp_path):
    run = script(launch, *flags(num_actors=1, total_timesteps=1_000_000, exp_name="first"), name="first")
    run.wait_for("actor\\(s\\) joined", timeout=60)
    time.sleep(2)  # a few updates
    run.proc.send_signal(signal.SIGINT)  # to the launcher only, as `kill -INT`
    code, out, err = run.finish(timeout=60)
    assert code == 128 + signal.SIGINT, out + err
    (path,) = glob.glob(f"{tmp_path}/runs/*__first__*/first.cleanrl_model")
    assert f"continue with --resume {os.path.relpath(path, tmp_path)}" in err
    checkpoint = torch.load(path, weights_only=True)
    step, version = checkpoint["global_step"], checkpoint["iteration"]
    assert step > 0 and version > 0

    total = step + 128
    code, out, err = script(launch, *flags(num_actors=1, total_timesteps=total, exp_name="resumed", resume=path,
                                           save_model=True, eval_episodes=1), name="resumed").finish(timeout=90)
    assert code == 0, out + err
    assert f"resumed from {path} at step {step} (version {version})" in out
    budget = total // 64 * 64
    run_dir, scalars = run_scalars(tmp_path, "resumed")
    assert scalars["charts/SPS"] and min(event_steps(run_dir, "charts/SPS")) > step
    resumed = torch.load(f"{run_dir}/resumed.cleanrl_model", weights_only=True)
    updates = (budget - step) // 64
    assert resumed["global_step"] == budget and resumed["iteration"] == version + updates
    # the optimiser and the statistics carried on (4 minibatches x 2 epochs per update)
    assert all(s["step"].item() == 8 * (version + updates) for s in resumed["optimizer"]["state"].values())
    assert resumed["obs_rms"]["count"] == pytest.approx(checkpoint["obs_rms"]["count"] + 64 * updates, abs=1e-3)


def event_steps(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return [event.step for event in acc.Scalars(tag)]


def test_bad_input_from_the_command_line(launch, tmp_path):
    path = tmp_path / "tampered.cleanrl_model"
    torch.save({"agent": Payload()}, path)  # unpickling it would print
    code, out, err = script(launch, *flags(resume=path)).finish(timeout=60)
    assert code != 0 and "Traceback" not in err and "this ran" not in out + err
    assert err.strip().splitlines()[-1].startswith(f"error: refusing to load {path}")
    assert not os.path.exists(tmp_path / "runs")
