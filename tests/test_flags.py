"""Every numeric option of the six MuJoCo scripts is checked before anything runs: a value outside the
interval the option takes ends the run with one line, `error: --<option> must be in <interval>, got
<value>`, and exit code 1, with no traceback, no env made and no log folder created."""

import dataclasses
import subprocess
import sys
import os
import typing

import pytest

import decoupled_ppo_continuous
import geppo_continuous
import ppo_continuous
import spo_continuous
import vaco_async
import vaco_continuous
from conftest import ROOT, TINY, run_script

# option -> values out of its range; every script's numeric options, less those main computes
SHARED = dict(total_timesteps=[0, -5], num_envs=[0], num_steps=[0], num_minibatches=[0], update_epochs=[0],
              learning_rate=[-1.0, 0.0, float("nan")], max_grad_norm=[-1.0, 0.0], clip_coef=[0.0], target_kl=[0.0],
              gamma=[-0.1, 1.5], gae_lambda=[-0.1, 2.0], ent_coef=[-0.01], vf_coef=[-1.0], eval_episodes=[-1],
              checkpoint_every=[-1], seed=[-1, 2**32])
SIMULATED = dict(policy_buffer=[0])  # the scripts with simulated lag
VTRACE = dict(rho_bar=[0.0], c_bar=[-1.0])
BAD = {ppo_continuous: {**SHARED, **SIMULATED, "kl_coef": [-0.1]},
       decoupled_ppo_continuous: {**SHARED, **SIMULATED},
       spo_continuous: {**SHARED, **SIMULATED, "epsilon": [0.0, -0.2]},
       vaco_continuous: {**SHARED, **SIMULATED, "tv_threshold": [0.0, -0.1], **VTRACE},
       geppo_continuous: {**SHARED, **SIMULATED, **VTRACE, "adapt_factor": [-0.1]},
       vaco_async: {**SHARED, "tv_threshold": [0.0, -0.1], **VTRACE, "num_actors": [0], "queue_batches": [0],
                    "max_policy_lag": [-1], "actor_delay_ms": [-1.0], "actor_timeout": [0.0],
                    "master_port": [-1, 65536]}}
CASES = [(module, name, value) for module, flags in BAD.items() for name, values in flags.items() for value in values]
script = pytest.mark.parametrize("module", BAD, ids=lambda m: m.__name__)


@pytest.mark.floatfree
@script
def test_every_numeric_option_has_its_bad_cases(module):
    numeric = {field.name for field in dataclasses.fields(module.Args)
               if field.init and {int, float} & {field.type, *typing.get_args(field.type)}}
    assert numeric == BAD[module].keys()


@pytest.mark.floatfree
@pytest.mark.parametrize("flag", ["--batch-size", "--minibatch-size", "--num-iterations"])
def test_the_sizes_main_computes_are_not_options(flag, tmp_path):
    # they follow from --num-envs, --num-steps, --num-minibatches and --total-timesteps: a value given for one
    # would be ignored, so the command line refuses it
    computed = {field.name for field in dataclasses.fields(ppo_continuous.Args) if not field.init}
    assert computed == {"batch_size", "minibatch_size", "num_iterations"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "ppo_continuous.py"), flag, "64"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"Unrecognized options: {flag}" in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.floatfree
@pytest.mark.parametrize("module, name, value", CASES, ids=[f"{m.__name__}-{n}={v}" for m, n, v in CASES])
def test_a_value_out_of_range_is_one_clear_error(module, name, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module.gym, "make", lambda *args, **kwargs: pytest.fail("an env was made"))
    with pytest.raises(SystemExit) as exc:
        module.main(module.Args(**{**TINY, name: value}))
    message = str(exc.value)
    assert message.startswith(f"error: --{name.replace('_', '-')} must be in ") and message.endswith(f", got {value}")
    assert "\n" not in message and not os.path.exists("runs")


FROM_THE_COMMAND_LINE = [(ppo_continuous, ("--num-envs", "0"), "error: --num-envs must be in [1, inf), got 0"),
                         (spo_continuous, ("--seed", "-1"), "error: --seed must be in [0, 4294967295], got -1"),
                         (vaco_continuous, ("--gamma", "1.5"), "error: --gamma must be in [0, 1], got 1.5"),
                         (geppo_continuous, ("--num-minibatches", "0"),
                          "error: --num-minibatches must be in [1, inf), got 0"),
                         (vaco_async, ("--learning-rate", "-1"), "error: --learning-rate must be in (0, inf), got -1.0")]


@pytest.mark.floatfree
@pytest.mark.parametrize("module, flags, message", FROM_THE_COMMAND_LINE,
                         ids=[module.__name__ for module, _, _ in FROM_THE_COMMAND_LINE])
def test_from_the_command_line_it_is_one_line_and_no_traceback(module, flags, message, tmp_path):
    result = run_script(f"{module.__name__}.py", *flags, cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "runs").exists()
