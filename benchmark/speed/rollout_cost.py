"""Where an env step's time goes: µs per env step of each part of the MuJoCo scripts' rollout, and of
their update, at CleanRL's layout (1 env x 2048 steps) and at the scripts' defaults (8 envs x 256 steps).

    python benchmark/speed/rollout_cost.py --env-id Ant-v4
    python benchmark/speed/rollout_cost.py --env-id Ant-v4 --against 5b8a53f        # beside that commit's scripts
    python benchmark/speed/rollout_cost.py --env-id Ant-v4 --no-compile --layouts 1x2048

Each script trains for a few updates in this process, through its own `main`, with a timer around each
part that its rollout calls. The parts, in µs per env step:

- env: the sub-envs' own `step` and `reset` (the env `gym.make` gives: the simulator and its wrappers);
- vector env: the vector env's step less the env's (gymnasium's SyncVectorEnv and the episode statistics);
- policy: the actors' forward pass and sampling (`PolicyBuffer.act`; `act` in vaco_async.py);
- normalisation: the observation statistics, `normalize_obs` and the reward scaler;
- bookkeeping: the rest of `collect_rollout` (the stores, conversions between torch and numpy, the
  action clip, the episodes that ended);
- update: the minibatch steps (compiled, unless --no-compile), per env step of the batch;
- per update: the rest of an update (advantages, flattening, logging), per env step.

A timer's own cost (measured here, about a µs a call) is taken out of the part that encloses it. The
first update of each run is left out (the compile, first calls); medians over the timed updates of all
repeats, whose runs alternate between the scripts (and with --against, between the two commits).
vaco_async.py's actors step their envs in processes of their own: here one actor's rollout is called in
this process as `run_actor` calls it, without the learner (the update and per-update columns stay empty).
Timings are noisy on a shared machine: run it on a quiet one; the ratios carry over to other machines.
"""

import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT, import_script, script_at  # noqa: E402
from benchmark.speed.sps import raw_env_rate  # noqa: E402

PARTS = ["env", "vector env", "policy", "normalisation", "bookkeeping"]
COLUMNS = PARTS + ["rollout", "update", "per update", "total"]


@dataclass
class Args:
    env_id: str = "Ant-v4"
    """the MuJoCo task"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous", "spo_continuous", "vaco_continuous",
                                                        "geppo_continuous", "vaco_async"])
    """the scripts (modules at the repository root) to profile"""
    layouts: list[str] = field(default_factory=lambda: ["1x2048", "8x256"])
    """envs x steps per update: CleanRL's layout and the scripts' defaults"""
    updates: int = 3
    """timed updates per run (after one left out)"""
    repeats: int = 3
    """runs per script, layout and commit; medians over all their timed updates"""
    policy_buffer: int = 1
    """K, the simulated lag (with K > 1 the actors act with up to K snapshots: more forward passes)"""
    compile: bool = True
    """time the compiled update (the scripts' default); --no-compile: the eager one"""
    against: Optional[str] = None
    """a commit (anything `git show` takes) whose scripts are profiled too, alternating with today's"""


class Timers:
    """Exclusive time per label: a timed call's time, less that of the timed calls inside it."""

    def __init__(self):
        self.totals, self.calls, self.inside = collections.defaultdict(float), collections.Counter(), []

    def wrap(self, label, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self.inside.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.totals[label] += elapsed - self.inside.pop()
                self.calls[label] += 1
                if self.inside:
                    self.inside[-1] += elapsed
        return timed

    def take(self):
        """The totals and call counts since the last take, and a fresh start."""
        totals, calls = dict(self.totals), dict(self.calls)
        self.totals.clear()
        self.calls.clear()
        return totals, calls


def timer_cost(repeats=20000):
    """Seconds a timed call adds to the part that encloses it, over an untimed call."""
    timers = Timers()
    timed, plain = timers.wrap("x", lambda: None), (lambda: None)
    costs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            plain()
        middle = time.perf_counter()
        for _ in range(repeats):
            timed()
        end = time.perf_counter()
        costs.append(((end - middle) - (middle - start)) / repeats)
    return statistics.median(costs)


@contextlib.contextmanager
def patched(obj, name, value):
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


def timed_envs(make_envs, timers):
    """make_envs, whose vector env and sub-envs are timed."""
    def make(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        envs.step = timers.wrap("vector env", envs.step)
        for env in envs.unwrapped.envs:
            env.step, env.reset = timers.wrap("env", env.step), timers.wrap("env", env.reset)
        return envs
    return make


def normalisation_timed(module, timers, stack):
    """Time the observation statistics, the normalisation and the reward scaler of `module`."""
    stack.enter_context(patched(module.RunningMeanStd, "update",
                                timers.wrap("normalisation", module.RunningMeanStd.update)))
    stack.enter_context(patched(module.RewardScaler, "__call__",
                                timers.wrap("normalisation", module.RewardScaler.__call__)))
    stack.enter_context(patched(module, "normalize_obs", timers.wrap("normalisation", module.normalize_obs)))


def profile_training(module, args, num_envs, num_steps):
    """One run of a synchronous script's main: per timed update, {column: seconds}."""
    timers, updates, starts = Timers(), [], []
    collect_rollout = timers.wrap("bookkeeping", module.collect_rollout)

    def rollout(*a, **k):
        starts.append(time.perf_counter())
        if len(starts) > 1:  # the previous update ends where this rollout starts
            updates.append((starts[-1] - starts[-2], *timers.take()))
        else:
            timers.take()
        return collect_rollout(*a, **k)

    def compiled_or_eager(step, enabled):
        return timers.wrap("update", original_compiled_or_eager(step, enabled))

    original_compiled_or_eager = module.compiled_or_eager
    script_args = module.Args(env_id=args.env_id, num_envs=num_envs, num_steps=num_steps,
                              total_timesteps=num_envs * num_steps * (args.updates + 2),
                              policy_buffer=args.policy_buffer, compile=args.compile, exp_name="profile")
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        stack.enter_context(patched(module, "collect_rollout", rollout))
        stack.enter_context(patched(module, "compiled_or_eager", compiled_or_eager))
        stack.enter_context(patched(module, "make_envs", timed_envs(module.make_envs, timers)))
        stack.enter_context(patched(module.PolicyBuffer, "act", timers.wrap("policy", module.PolicyBuffer.act)))
        normalisation_timed(module, timers, stack)
        stack.enter_context(contextlib.redirect_stdout(open(os.devnull, "w")))
        stack.callback(os.chdir, os.getcwd())
        os.chdir(folder)
        torch._dynamo.reset()  # every run compiles its own step, as a fresh process would
        module.main(script_args)
    return updates[1:]  # the first update compiles and warms up


def profile_actor(module, args, num_envs, num_steps):
    """vaco_async.py's actor rollout, called as run_actor calls it, for updates + 1 segments."""
    timers, updates = Timers(), []
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(module, "act", timers.wrap("policy", module.act)))
        normalisation_timed(module, timers, stack)
        script_args = module.Args(env_id=args.env_id, num_envs=num_envs, num_steps=num_steps, num_actors=1)
        envs = timed_envs(module.make_envs, timers)(script_args, "profile")
        obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
        torch.set_num_threads(1)
        actor, obs_rms = module.Actor(obs_dim, act_dim).requires_grad_(False), module.RunningMeanStd(shape=(obs_dim,))
        generator = torch.Generator().manual_seed(1)
        layout = module.SegmentLayout(num_steps, num_envs, obs_dim, act_dim)
        segment = layout.views(torch.zeros(layout.size, dtype=torch.float64))
        raw_obs, _ = envs.reset(seed=1)
        obs_rms.update(raw_obs)
        current_obs = module.normalize_obs(raw_obs, obs_rms)
        collect_rollout = timers.wrap("bookkeeping", module.collect_rollout)
        for _ in range(args.updates + 1):
            timers.take()
            start = time.perf_counter()
            current_obs = collect_rollout(envs, actor, obs_rms, current_obs, segment, generator)
            updates.append((time.perf_counter() - start, *timers.take()))
        envs.close()
    return updates[1:]


def per_env_step(update, batch, timer_seconds, actor_only):
    """{column: µs per env step} of one update (its wall time, exclusive totals and call counts)."""
    wall, totals, calls = update
    cost = {label: seconds / batch * 1e6 for label, seconds in totals.items()}
    # each timed call's own cost landed in the part that encloses it: the vector env's sub-env timers,
    # the rollout's timers of everything else
    cost["vector env"] = cost.get("vector env", 0.0) - calls.get("env", 0) * timer_seconds / batch * 1e6
    inside_rollout = sum(n for label, n in calls.items() if label not in ("bookkeeping", "update", "env"))
    cost["bookkeeping"] -= inside_rollout * timer_seconds / batch * 1e6
    row = {part: cost.get(part, 0.0) for part in PARTS}
    row["rollout"] = sum(row.values())
    if actor_only:
        row["total"] = row["rollout"]
        return row
    row["update"] = cost.get("update", 0.0)
    row["total"] = wall / batch * 1e6 - sum(calls.values()) * timer_seconds / batch * 1e6
    row["per update"] = row["total"] - row["rollout"] - row["update"]
    return row


def layout_of(text):
    try:
        num_envs, num_steps = (int(part) for part in text.lower().split("x"))
    except ValueError:
        sys.exit(f"error: a layout is ENVSxSTEPS, such as 8x256; got '{text}'")
    return num_envs, num_steps


def modules(args):
    """[(label, module)]: today's scripts, and with --against that commit's."""
    found = []
    folder = tempfile.mkdtemp()
    for script in args.scripts:
        if not os.path.exists(os.path.join(ROOT, f"{script}.py")):
            sys.exit(f"error: no script {script}.py at the repository root")
        found.append((script, import_script(os.path.join(ROOT, f"{script}.py"), script)))
        if args.against:
            path = script_at(args.against, f"{script}.py", folder)
            if path is None:
                print(f"note: no {script}.py at {args.against} (or git is not at hand): today's only", file=sys.stderr)
                continue
            found.append((f"{script} @{args.against[:8]}", import_script(path, f"{script}_at_{args.against[:12]}")))
    return found


def main(args: Args):
    warnings.filterwarnings("ignore")  # the v4 tasks' deprecation notice, once per env
    layouts = [layout_of(text) for text in args.layouts]
    scripts = modules(args)
    timer_seconds = timer_cost()
    print(f"{args.env_id}, K = {args.policy_buffer}, update {'compiled' if args.compile else 'eager'}; "
          f"{args.updates} timed updates x {args.repeats} repeats; a timer costs {timer_seconds * 1e6:.2f} µs",
          flush=True)
    for num_envs, num_steps in layouts:
        batch = num_envs * num_steps
        rows = collections.defaultdict(list)
        raw = []
        for repeat in range(args.repeats):
            raw.append(1e6 / raw_env_rate(args.env_id, 5000, seed=repeat))
            order = scripts if repeat % 2 == 0 else scripts[::-1]
            for label, module in order:
                actor_only = not hasattr(module, "PolicyBuffer")
                profile = profile_actor if actor_only else profile_training
                for update in profile(module, args, num_envs, num_steps):
                    rows[label].append(per_env_step(update, batch, timer_seconds, actor_only))
            print(f"  {num_envs}x{num_steps}: repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        width = max(len(label) for label, _ in scripts) + 2
        print(f"\n{num_envs} env(s) x {num_steps} steps: µs per env step (medians); the raw env "
              f"(`gym.make`, random actions): {statistics.median(raw):.0f} µs, "
              f"{1e6 / statistics.median(raw):.0f} steps/s")
        print(f"| {'script':{width}s} | " + " | ".join(COLUMNS) + " | SPS |")
        print(f"|{'-' * (width + 2)}|" + "|".join("-" * (len(c) + 2) for c in COLUMNS) + "|-----|")
        for label, _ in scripts:
            medians = {c: statistics.median(r[c] for r in rows[label]) if c in rows[label][0] else None
                       for c in COLUMNS}
            cells = [f"{medians[c]:{len(c)}.0f}" if medians[c] is not None else " " * len(c) for c in COLUMNS]
            sps = f"{1e6 / medians['total']:.0f}" if medians["update"] is not None else ""
            print(f"| {label:{width}s} | " + " | ".join(cells) + f" | {sps} |", flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
