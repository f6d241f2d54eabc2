"""A run keeps what it made. The MuJoCo scripts' run management (below their fence) is one code in all of them
(test_equivalence.py), so what holds for one holds for all; each test runs on the scripts whose code differs there
(GePPO's checkpoints carry its learning-rate factor) or on ppo_continuous.py where a run is slow.

- its settings travel with its checkpoint: a resumed run takes every option the command line leaves out from it,
  and refuses one the command line names that would change the run;
- a file that is not one of its checkpoints is one line, before any env is built;
- a save is atomic: a failed one leaves no half-written file and the earlier checkpoints whole;
- Ctrl-C and SIGTERM end the update under way, save a checkpoint and say how to resume it (exit 130 and 143);
- a loss or weight that stops being finite stops the run with one line and no checkpoint of those weights.
"""

import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import geppo_continuous
import ppo_continuous
from conftest import ROOT, TINY, cli_flags, read_scalars

# the run management is one code in the five scripts (test_equivalence.py); GePPO's checkpoint has a part of its own
SCRIPTS = [ppo_continuous, geppo_continuous]
script = pytest.mark.parametrize("module", SCRIPTS, ids=lambda m: m.__name__)
CLI = cli_flags(**TINY)  # TINY's run as a command line: 2 updates of 2 envs x 64 steps, eager


def run(*flags, cwd, script="ppo_continuous.py"):
    """The script run as a user runs it; returns (exit code, stdout, stderr)."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *flags], cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    return result.returncode, result.stdout, result.stderr


def last_line(text):
    return text.strip().splitlines()[-1]


# --- settings -----------------------------------------------------------------------------------

@pytest.mark.floatfree
def test_a_resumed_run_takes_its_settings_from_its_checkpoint(tmp_path):
    code, out, err = run(*CLI, "--policy-buffer", "4", "--gamma", "0.95", "--save-model", "--eval-episodes", "0",
                         cwd=tmp_path)
    assert code == 0, err
    (checkpoint,) = glob.glob(f"{tmp_path}/runs/*/ppo_continuous.cleanrl_model")
    # only the length and the name on the command line: K, gamma and the layout come from the checkpoint
    code, out, err = run("--resume", checkpoint, "--total-timesteps", "512", "--exp-name", "resumed", cwd=tmp_path)
    assert code == 0, err
    (resumed,) = glob.glob(f"{tmp_path}/runs/*__resumed__*")
    assert max(read_scalars(resumed)["charts/policy_lag_max"]) > 0 and "step 512/512" in out  # lagged, to the end
    final = torch.load(glob.glob(f"{resumed}/*.cleanrl_model")[0], weights_only=True)
    assert len(final["policy_buffer"]) == 4  # K = 4 snapshots after 4 updates (K = 1, the default, holds one)
    assert [final["args"][name] for name in ("policy_buffer", "gamma", "num_envs", "compile")] == [4, 0.95, 2, False]
    # an option that would change the run, named on the command line, is refused: even at its default
    for flags, message in [(("--policy-buffer", "2"), "--policy-buffer 2 differs from 4"),
                           (("--policy-buffer", "1"), "--policy-buffer 1 differs from 4"),
                           (("--no-norm-adv",), "--norm-adv False differs from True"),
                           (("--env-id", "Ant-v4"), "--env-id Ant-v4 differs from Hopper-v4")]:
        code, out, err = run("--resume", checkpoint, "--total-timesteps", "512", *flags, cwd=tmp_path)
        assert code == 1 and "Traceback" not in err, err
        assert last_line(err).startswith(f"error: {message}, the value {checkpoint} was trained with")
    assert len(os.listdir(tmp_path / "runs")) == 2  # refused before anything was written


@pytest.mark.floatfree
def test_another_script_s_checkpoint_is_refused_naming_both(tmp_path):
    code, _, err = run(*CLI, "--save-model", "--eval-episodes", "0", cwd=tmp_path, script="vaco_continuous.py")
    assert code == 0, err
    (checkpoint,) = glob.glob(f"{tmp_path}/runs/*/*.cleanrl_model")
    code, _, err = run("--resume", checkpoint, cwd=tmp_path)
    assert code == 1 and last_line(err) == f"error: {checkpoint}: not a checkpoint of ppo_continuous.py but of " \
                                           "vaco_continuous.py"


# --- files that are not our checkpoints ---------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{module: the path of a checkpoint that module saved after a tiny run}."""
    folder = tmp_path_factory.mktemp("checkpoints")
    paths, cwd = {}, os.getcwd()
    os.chdir(folder)
    try:
        for module in SCRIPTS:
            module.main(module.Args(**TINY, save_model=True, eval_episodes=0, exp_name=module.__name__))
            (paths[module],) = glob.glob(f"runs/*__{module.__name__}__*/*.cleanrl_model")
            paths[module] = str(folder / paths[module])
    finally:
        os.chdir(cwd)
    return paths


def not_ours(kind, module, checkpoint, folder):
    """A file of `kind` at a path in `folder` (its path), and the end of the line it must give."""
    path, script = str(folder / f"{kind}.pt"), f"{module.__name__}.py"
    saved = torch.load(checkpoint, weights_only=True)
    if kind == "missing":
        return str(folder / "nothing-here.pt"), "no such file"
    if kind == "folder":
        os.makedirs(path)
    elif kind == "empty":
        open(path, "w").close()
    elif kind == "text":
        open(path, "w").write("step,return\n1,2\n")
    elif kind == "source":
        open(path, "w").write(open(os.path.join(ROOT, script)).read())
    elif kind == "truncated":
        open(path, "wb").write(open(checkpoint, "rb").read()[:3000])
    elif kind == "foreign dict":
        torch.save({"weights": torch.zeros(3)}, path)
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "missing field":
        torch.save({key: value for key, value in saved.items() if key != "obs_rms"}, path)
        return path, f"a checkpoint of {script} without its obs_rms"
    elif kind == "another script's":
        torch.save({**saved, "script": "vaco_async.py"}, path)
        return path, f"not a checkpoint of {script} but of vaco_async.py"
    return path, "not a checkpoint" + (f" of {script}" if kind in ("foreign dict", "tensor") else "")


KINDS = ["missing", "folder", "empty", "text", "source", "truncated", "foreign dict", "tensor", "missing field",
         "another script's"]


@pytest.mark.floatfree
@script
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_that_is_not_our_checkpoint_is_one_line_before_any_env(module, kind, checkpoints, tmp_path,
                                                                      monkeypatch):
    path, message = not_ours(kind, module, checkpoints[module], tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module.gym, "make", lambda *args, **kwargs: pytest.fail("an env was made"))
    with pytest.raises(SystemExit) as exc:
        module.main(module.Args(**TINY, resume=path))
    assert str(exc.value) == f"error: {path}: {message}"
    assert not os.path.exists("runs")


@pytest.mark.floatfree
def test_from_the_command_line_a_truncated_checkpoint_is_one_line(checkpoints, tmp_path):
    path, message = not_ours("truncated", ppo_continuous, checkpoints[ppo_continuous], tmp_path)
    code, out, err = run("--resume", path, cwd=tmp_path)
    assert (code, out, err.strip()) == (1, "", f"error: {path}: {message}")


# --- saves --------------------------------------------------------------------------------------

@script
def test_a_failed_save_leaves_the_earlier_checkpoints_whole_and_is_one_line(module, train, monkeypatch):
    saves, save = [], torch.save

    def disk_full_at_the_second_save(obj, path):
        saves.append(path)
        if len(saves) == 2:
            open(path, "wb").write(b"PK\x03\x04 half of it")  # what a full disk leaves
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 1024")
        save(obj, path)

    monkeypatch.setattr(module.torch, "save", disk_full_at_the_second_save)
    with pytest.raises(SystemExit) as exc:
        train(module, total_timesteps=384, save_model=True, checkpoint_every=1, eval_episodes=0)
    (folder,) = glob.glob("runs/*")
    second = f"{folder}/{module.__name__}_step256.cleanrl_model"
    assert str(exc.value) == f"error: could not save the checkpoint {second}: [enforce fail at " \
                             "inline_container.cc:603] . unexpected pos 64 vs 1024"
    kept = [name for name in os.listdir(folder) if not name.startswith("events.")]
    assert kept == [f"{module.__name__}_step128.cleanrl_model"]  # no .tmp, no half-written file
    assert module.load_checkpoint(f"{folder}/{module.__name__}_step128.cleanrl_model")["global_step"] == 128


@pytest.mark.floatfree
def test_a_run_folder_that_cannot_be_made_is_one_line(tmp_path):
    open(tmp_path / "runs", "w").close()  # runs/ is a file
    code, out, err = run(*CLI, cwd=tmp_path)
    assert code == 1 and "Traceback" not in err and last_line(err).startswith("error: cannot make the run folder runs/")


# --- a stop keeps the work ----------------------------------------------------------------------

def started_run(tmp_path, *flags):
    """A long run of ppo_continuous.py, once it has printed its first progress line."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "ppo_continuous.py"), *cli_flags(
        **{**TINY, "total_timesteps": 10**6}), *flags], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    for line in proc.stdout:
        if line.startswith("run folder: "):
            return proc
    pytest.fail(f"the run ended before it started: {proc.stderr.read()}")


@pytest.mark.floatfree
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_saves_a_checkpoint_and_says_how_to_resume(signum, code, tmp_path):
    # the signal comes at a random moment of a rollout or an update, three times: each time the update under way
    # ends, a checkpoint of it is saved, and the line says how to go on; then one of them resumes
    for attempt in range(3):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        proc = started_run(folder, "--exp-name", "stopped")
        time.sleep(random.uniform(0.5, 2.5))
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code and "Traceback" not in err, err
        (checkpoint,) = glob.glob(f"{folder}/runs/*/stopped.cleanrl_model")
        step = torch.load(checkpoint, weights_only=True)["global_step"]
        relative = os.path.relpath(checkpoint, folder)
        assert last_line(out) == f"stopped at step {step}; continue with: python ppo_continuous.py --resume {relative}"
        assert step % 128 == 0 and step > 0
    code, out, err = run("--resume", relative, "--total-timesteps", str(step + 256), cwd=folder)
    assert code == 0 and f"resumed from {relative} at step {step}" in out, err


@pytest.mark.floatfree
def test_a_second_signal_stops_at_once_without_a_checkpoint(tmp_path):
    proc = started_run(tmp_path, "--exp-name", "twice")
    proc.send_signal(signal.SIGINT)
    assert next(line for line in proc.stdout if line.strip()) == \
        "SIGINT: stopping after this update (again: at once, unsaved)\n"
    proc.send_signal(signal.SIGINT)  # once the first has been heard: two at once are one signal
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert not glob.glob(f"{tmp_path}/runs/*/*.cleanrl_model")


# --- divergence ---------------------------------------------------------------------------------

@script
def test_a_diverged_run_stops_with_one_line_keeping_its_finite_checkpoints(module, train, monkeypatch):
    # the loss turns NaN from the 3rd update on (8 minibatch steps an update): the run stops after it, saving no
    # checkpoint of its weights; those of updates 1 and 2 stay, finite
    steps, loss_of = [], module.minibatch_loss

    def nan_from_update_3(params, *args):
        steps.append(1)
        loss, stats = loss_of(params, *args)
        return (loss * float("nan"), stats) if len(steps) > 16 else (loss, stats)

    monkeypatch.setattr(module, "minibatch_loss", nan_from_update_3)
    with pytest.raises(SystemExit) as exc:
        train(module, total_timesteps=640, save_model=True, checkpoint_every=1, eval_episodes=0)
    assert str(exc.value).startswith("error: update 3 made the policy_loss")  # its next minibatch's, on NaN weights
    assert str(exc.value).endswith(" NaN or infinite: the run stopped (its checkpoints before it, if any: "
                                   f"{glob.glob('runs/*')[0]})")
    saved = sorted(glob.glob("runs/*/*.cleanrl_model"))
    assert [os.path.basename(p) for p in saved] == [f"{module.__name__}_step128.cleanrl_model",
                                                    f"{module.__name__}_step256.cleanrl_model"]
    for path in saved:
        assert all(torch.isfinite(value).all() for value in torch.load(path, weights_only=True)["agent"].values())


@pytest.mark.floatfree
def test_a_learning_rate_that_blows_up_ends_with_one_line(tmp_path):
    code, out, err = run(*CLI, "--learning-rate", "1000", cwd=tmp_path)
    assert code == 1 and "Traceback" not in err
    assert last_line(err).startswith("error: update ") and "NaN or infinite: the run stopped" in last_line(err)


# --- what a newcomer reads ----------------------------------------------------------------------

@pytest.mark.floatfree
def test_the_first_lines_say_where_the_run_goes_and_what_the_figures_mean(tmp_path):
    code, out, err = run(*cli_flags(**{**TINY, "total_timesteps": 300}), cwd=tmp_path)
    assert code == 0, err
    lines = out.splitlines()
    # 300 steps is not a whole number of batches of 128: the first line says where the run ends, and it ends there
    assert lines[0] == "note: the run trains to step 256, the last whole batch of 128 within --total-timesteps 300"
    (folder,) = os.listdir(tmp_path / "runs")
    assert lines[1].startswith(f"run folder: runs/{folder} (tensorboard --logdir runs). Below, return: the mean of "
                               "the last 100 episodes; lag: how many updates behind the learner")
    assert lines[-1].startswith("step 256/256 (100%) | SPS: ")


def test_the_eta_leaves_out_the_first_update(monkeypatch, capsys):
    # the first update takes 60 s (it compiles the update step), the next ones 1 s each: the time left is counted at
    # 1 s an update, and nothing is printed before the pace is known
    clock = iter([0.0, 60.0, 71.0, 82.0])
    monkeypatch.setattr(ppo_continuous.time, "time", lambda: next(clock))
    progress = ppo_continuous.Progress(0, 100 * 128)
    progress.update(128, [1.0], lag=0.0, last=False)  # at 60 s
    assert capsys.readouterr().out == ""
    progress.update(11 * 128, [1.0], lag=0.0, last=False)  # at 71 s: 10 updates in 11 s since the first
    assert capsys.readouterr().out.strip().endswith("ETA 1m37s")  # 89 updates at 1.1 s


def test_a_missing_optional_dependency_of_an_env_is_one_line(monkeypatch, tmp_path):
    def box2d_missing(entry_point):
        raise ppo_continuous.gym.error.DependencyNotInstalled(
            'Box2D is not installed, you can install it by run `pip install swig` followed by '
            '`pip install "gymnasium[box2d]"`')

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo_continuous.gym.envs.registration, "load_env_creator", box2d_missing)
    with pytest.raises(SystemExit) as exc:
        ppo_continuous.main(ppo_continuous.Args(**{**TINY, "env_id": "LunarLanderContinuous-v3"}))
    assert str(exc.value) == ("error: LunarLanderContinuous-v3 needs a package that is not installed: Box2D is not "
                              'installed, you can install it by run `pip install swig` followed by `pip install '
                              '"gymnasium[box2d]"`')
    assert not os.path.exists("runs")
