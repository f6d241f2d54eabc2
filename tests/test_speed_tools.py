"""The speed benchmarks' own logic: rollout_cost.py's timers and arithmetic, and sps.py's copy of CleanRL's
script patched for gymnasium 1.x (the timings themselves are measured by running the benchmarks)."""

import time

import pytest

from benchmark.speed import rollout_cost, sps

pytestmark = pytest.mark.floatfree  # timers, file patching: no float computed by torch


def test_timers_count_each_part_without_the_parts_inside_it():
    timers = rollout_cost.Timers()
    inner = timers.wrap("inner", lambda: time.sleep(0.02))

    def outer():
        time.sleep(0.01)
        inner()
        inner()

    timers.wrap("outer", outer)()
    totals, calls = timers.take()
    assert calls == {"outer": 1, "inner": 2}
    assert totals["inner"] == pytest.approx(0.04, abs=0.015) and totals["outer"] == pytest.approx(0.01, abs=0.015)
    assert timers.take() == ({}, {})  # a fresh start


def test_per_env_step_takes_the_timers_own_cost_out_of_the_enclosing_part():
    # one update of 100 env steps: 1 s of wall time; a timer costs 1 ms a call
    totals = {"bookkeeping": 0.1, "vector env": 0.1, "env": 0.3, "policy": 0.2, "normalisation": 0.05, "update": 0.15}
    calls = {"bookkeeping": 1, "vector env": 10, "env": 10, "policy": 10, "normalisation": 20, "update": 5}
    row = rollout_cost.per_env_step((1.0, totals, calls), batch=100, timer_seconds=1e-3, actor_only=False)
    # µs per env step: the vector env loses its 10 sub-env timers, the bookkeeping the 40 timers inside it
    assert row["vector env"] == pytest.approx((0.1 - 10e-3) / 100 * 1e6)
    assert row["bookkeeping"] == pytest.approx((0.1 - 40e-3) / 100 * 1e6)
    assert row["rollout"] == pytest.approx(sum(row[p] for p in rollout_cost.PARTS))
    assert row["total"] == pytest.approx((1.0 - 56e-3) / 100 * 1e6)  # every timer's cost out of the wall time
    assert row["per update"] == pytest.approx(row["total"] - row["rollout"] - row["update"])


CLEANRL_LIKE = '''import numpy as np
def make_env():
    env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))
def loop():
    for step in range(3):
{episodes}
'''


def test_cleanrl_is_patched_in_a_copy_where_gymnasium_1x_changed_and_nowhere_else(tmp_path):
    original = CLEANRL_LIKE.format(episodes=sps.CLEANRL_PATCHES[1][0])
    path = tmp_path / "ppo_continuous_action.py"
    path.write_text(original)
    (tmp_path / "copy").mkdir()
    copy = sps.patched_cleanrl(str(path), str(tmp_path / "copy"))
    assert path.read_text() == original  # the file given is untouched
    patched = open(copy).read()
    assert "lambda obs: np.clip(obs, -10, 10), env.observation_space)" in patched
    assert 'np.flatnonzero(infos["_episode"])' in patched and "final_info" not in patched
    assert patched.replace(sps.CLEANRL_PATCHES[0][1], "").replace(sps.CLEANRL_PATCHES[1][1], "") == \
        original.replace(sps.CLEANRL_PATCHES[0][0], "").replace(sps.CLEANRL_PATCHES[1][0], "")


def test_a_file_that_is_not_the_known_script_is_one_line_of_error(tmp_path):
    path = tmp_path / "other.py"
    path.write_text("print('hello')\n")
    with pytest.raises(SystemExit, match="not the ppo_continuous_action.py this patch knows"):
        sps.patched_cleanrl(str(path), str(tmp_path))
    with pytest.raises(SystemExit, match="No such file"):
        sps.patched_cleanrl(str(tmp_path / "missing.py"), str(tmp_path))


FAKE_SCRIPT = '''
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter("runs/fake")
for step in (100, 200, 300):
    writer.add_scalar("charts/SPS", 1, step)
writer.close()
print("step 100/300 | SPS: 80 | ETA 1m")
print("step 300/300 | SPS: 95 | ETA 0s")
'''


def test_a_whole_run_is_the_last_sps_the_script_prints(tmp_path):
    (tmp_path / "fake.py").write_text(FAKE_SCRIPT)
    args = sps.Args(whole_run=True)
    rate, waits = sps.script_sps(str(tmp_path / "fake.py"), args)
    assert (rate, waits) == (95, None)
    steady, _ = sps.script_sps(str(tmp_path / "fake.py"), sps.Args())  # the log's 200 steps over its wall time
    assert steady != 95 and steady > 0
