"""Time per minibatch step of each MuJoCo script's update: compiled (the default), the same function
run eagerly (`--no-compile`), and the textbook eager step it replaces (the module's forward,
`loss.backward()`, `clip_grad_norm_` and fused `torch.optim.Adam`, around the script's very loss).

    python benchmark/speed/update_step.py --env-id Ant-v4
    python benchmark/speed/update_step.py --env-id Ant-v4 --against 91692b6   # and that commit's compiled step

One process, one thread (as the scripts run), a random batch of the task's shapes; the three
paths run in interleaved blocks, and the medians over blocks are reported with the compile time.
Ratios are what carry over to other machines.
"""

import contextlib
import functools
import importlib
import inspect
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import gymnasium as gym
import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import import_script, script_at  # noqa: E402


@dataclass
class Args:
    env_id: str = "Ant-v4"
    """the task whose observation and action sizes the networks take"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous", "spo_continuous", "vaco_continuous",
                                                        "vaco_async"])
    """the scripts (modules at the repository root) whose update is timed"""
    batch_size: int = 2048
    """transitions in the batch the minibatches are drawn from"""
    minibatch_size: int = 64
    """transitions per minibatch (CleanRL's 2048 / 32)"""
    steps: int = 200
    """minibatch steps per timed block"""
    blocks: int = 7
    """timed blocks per path (interleaved); medians are reported"""
    against: Optional[str] = None
    """a commit (anything `git show` takes) whose scripts' compiled step is timed too, in the same
    interleaved blocks: the speed of a change to the step, measured in one process"""


@contextlib.contextmanager
def plain_forward(module):
    """Make the script's loss call its module directly: torch.func.functional_call with the
    module's own parameters is then an ordinary forward pass (the textbook eager step)."""
    original = module.torch.func.functional_call
    module.torch.func.functional_call = lambda net, params, inputs: net(*inputs)
    try:
        yield
    finally:
        module.torch.func.functional_call = original


def module_at(commit, script):
    """The module `script` as of `commit`, imported under another name beside today's."""
    path = script_at(commit, f"{script}.py", tempfile.mkdtemp())
    if path is None:
        sys.exit(f"error: cannot read {script}.py at {commit} (git, or that commit, is not at hand)")
    return import_script(path, f"{script}_at_{commit[:12]}")


def mains_step(module, params, adam, flat, lr, agent, script_args):
    """step(indices): one minibatch step of the compiled update, built and called as the module's main does."""
    if hasattr(module, "compiled_or_eager"):
        step = module.compiled_or_eager(module.train_step, True)
        return lambda indices: step(params, adam, flat, indices, lr, agent, script_args)
    # the scripts before their fenced layout (91692b6 and earlier): a partial, behind a first-call switch
    step = module.compile_train_step(functools.partial(module.train_step, agent=agent, args=script_args), True)
    return lambda indices: step(params, adam, flat, indices, lr)


def batch_for(module, flat):
    """`flat` under the keys `module` reads: beta's log-probabilities are `logprobs` in the scripts of the
    commits before they were named `behaviour_logprobs`."""
    if '"behaviour_logprobs"' in inspect.getsource(module):
        return flat
    return {"logprobs" if key == "behaviour_logprobs" else key: value for key, value in flat.items()}


def paths(module, obs_dim, act_dim, args, against=None):
    """{name: (step(indices), compile seconds)} for the three ways of taking one minibatch step."""
    torch.manual_seed(0)
    script_args = module.Args()
    g = torch.Generator().manual_seed(0)
    flat = dict(obs=torch.randn(args.batch_size, obs_dim, generator=g),
                actions=torch.randn(args.batch_size, act_dim, generator=g),
                behaviour_logprobs=torch.randn(args.batch_size, generator=g) - act_dim,
                advantages=torch.randn(args.batch_size, generator=g), returns=torch.randn(args.batch_size, generator=g),
                values=torch.randn(args.batch_size, generator=g),
                proximal_logprobs=torch.randn(args.batch_size, generator=g) - act_dim)
    lr = torch.tensor(script_args.learning_rate)
    out = {}

    reference = module.Agent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(reference.parameters(), lr=script_args.learning_rate, eps=1e-5, fused=True)

    def textbook(indices):
        mb = {key: value[indices] for key, value in flat.items()}
        with plain_forward(module):
            loss, _ = module.minibatch_loss(dict(reference.named_parameters()), reference, mb, script_args)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), script_args.max_grad_norm)
        optimizer.step()

    out["eager nn.Module + backward + torch.optim.Adam"] = (textbook, 0.0)
    steps = [("train_step, eager (--no-compile)", module, False), ("train_step, compiled (default)", module, True)]
    if against is not None:
        steps.append((f"train_step, compiled, as of {args.against}", against, True))
    for name, source, compiled in steps:
        agent = source.Agent(obs_dim, act_dim)
        params = {key: p.detach() for key, p in agent.named_parameters()}
        adam = source.adam_state(params)
        batch = batch_for(source, flat)
        if compiled:
            step = mains_step(source, params, adam, batch, lr, agent, script_args)
        else:
            step = functools.partial(source.train_step, params, adam, batch, lr=lr, agent=agent, args=script_args)
        start = time.perf_counter()
        step(torch.arange(args.minibatch_size))  # the first call compiles
        out[name] = (step, time.perf_counter() - start if compiled else 0.0)
    return out


def main(args: Args):
    torch.set_num_threads(1)
    env = gym.make(args.env_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    env.close()
    g = torch.Generator().manual_seed(1)
    print(f"{args.env_id} (observations {obs_dim}, actions {act_dim}), minibatch {args.minibatch_size}, "
          f"{args.blocks} interleaved blocks of {args.steps} steps, microseconds per step (median):")
    for script in args.scripts:
        module = importlib.import_module(script)
        against = module_at(args.against, script) if args.against else None
        timed = paths(module, obs_dim, act_dim, args, against)
        blocks = {name: [] for name in timed}
        for block in range(args.blocks):
            order = list(timed.items())
            for name, (step, _) in order[::-1] if block % 2 else order:  # each path before and after the others
                indices = [torch.randperm(args.batch_size, generator=g)[: args.minibatch_size] for _ in range(args.steps)]
                start = time.perf_counter()
                for i in indices:
                    step(i)
                blocks[name].append((time.perf_counter() - start) / args.steps * 1e6)
        medians = {name: statistics.median(values) for name, values in blocks.items()}
        reference = medians["eager nn.Module + backward + torch.optim.Adam"]
        print(f"\n{script}.py")
        for name, median in medians.items():
            compile_time = timed[name][1]
            print(f"  {name:48s} {median:7.0f} us  {reference / median:5.2f}x"
                  + (f"  (compiled in {compile_time:.1f} s)" if compile_time else ""))
        if against is not None:
            ratio = medians["train_step, compiled (default)"] / medians[f"train_step, compiled, as of {args.against}"]
            print(f"  today's compiled step / as of {args.against}: {ratio:.3f} (medians)")
        torch._dynamo.reset()


if __name__ == "__main__":
    main(tyro.cli(Args))
