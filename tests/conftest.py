"""Helpers shared by the tests: tiny training runs in a temporary folder and their TensorBoard logs."""

import glob
import os
import subprocess
import sys

import pytest

from benchmark.common import read_scalars  # the one reader of a run's TensorBoard log (tests import it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A few seconds of training: 2 updates of 2 envs x 64 steps.
TINY = dict(env_id="Hopper-v4", total_timesteps=256, num_envs=2, num_steps=64, num_minibatches=4, update_epochs=2,
            compile=False)  # eager: the compiled path has tests of its own


def cli_flags(**settings):
    """Command-line flags for `settings`: --name value, and booleans as --name / --no-name."""
    flags = []
    for key, value in settings.items():
        name = key.replace("_", "-")
        flags += [f"--{name}" if value else f"--no-{name}"] if isinstance(value, bool) else [f"--{name}", str(value)]
    return flags


@pytest.fixture(autouse=True, scope="session")
def no_run_in_the_repository():
    """A test that trains outside its temporary folder fails the session (two such runs in one second collide)."""
    before = set(glob.glob(os.path.join(ROOT, "runs", "*")))
    yield
    assert set(glob.glob(os.path.join(ROOT, "runs", "*"))) == before, "a test wrote runs/ into the repository"


@pytest.fixture(autouse=True)
def writers_closed(monkeypatch):
    """Every TensorBoard writer a test's run opened is closed when the test ends, while the test's folder is still the
    working directory: a run a test stops on purpose (a failed save, a bad flag) never reaches its writer.close(), and
    the writer's thread would flush later into runs/... relative to another folder, an error in some later test."""
    from torch.utils.tensorboard import SummaryWriter

    opened, init = [], SummaryWriter.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(SummaryWriter, "__init__", recording)
    yield
    for writer in opened:
        writer.close()


@pytest.fixture
def train(tmp_path, monkeypatch):
    """train(module, **overrides) runs module.main in a fresh folder; returns (run_dir, scalars)."""
    monkeypatch.chdir(tmp_path)

    def run(module, **overrides):
        before = set(glob.glob("runs/*"))
        module.main(module.Args(**{**TINY, **overrides}))
        (run_dir,) = set(glob.glob("runs/*")) - before
        return run_dir, read_scalars(run_dir)

    return run


def run_script(script, *flags, cwd, env=None):
    """Run a top-level script as a user would; returns the CompletedProcess."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
