"""The compiled minibatch update (torch.compile of `train_step`) against the same function run
eagerly, and the eager update against torch.optim.Adam with clip_grad_norm_. The other tests run
the eager path (conftest.TINY), so each script's compiled loss is checked here."""

import numpy as np
import pytest
import torch

import geppo_continuous
import ppo_continuous
import spo_continuous
import vaco_async
import vaco_continuous

SCRIPTS = [ppo_continuous, spo_continuous, vaco_continuous, vaco_async, geppo_continuous]
script = pytest.mark.parametrize("module", SCRIPTS, ids=lambda m: m.__name__)


def random_flat(obs_dim=11, act_dim=3, size=256, seed=0):
    """A flattened batch with every field a script's minibatch loss may read."""
    g = torch.Generator().manual_seed(seed)
    return dict(obs=torch.randn(size, obs_dim, generator=g), actions=torch.randn(size, act_dim, generator=g),
                behaviour_logprobs=torch.randn(size, generator=g) - 3, advantages=torch.randn(size, generator=g),
                returns=torch.randn(size, generator=g), values=torch.randn(size, generator=g),
                proximal_logprobs=torch.randn(size, generator=g) - 3)


def rate(module, value):
    """The `lr` train_step takes: one rate, or GePPO's two (the critic's and the actor's)."""
    if module is geppo_continuous:
        return {"critic": torch.tensor(value), "actor": torch.tensor(value)}
    return torch.tensor(value)


def anneal(lr, value):
    """Set every rate of `lr` (`rate`'s) to `value`, in place."""
    for tensor in lr.values() if isinstance(lr, dict) else [lr]:
        tensor.fill_(value)


def fresh(module, seed=0):
    torch.manual_seed(seed)
    agent = module.Agent(11, 3)
    params = {name: p.detach() for name, p in agent.named_parameters()}
    return agent, params, module.adam_state(params)


@script
def test_eager_update_is_adam_with_gradient_clipping(module):
    # train_step's hand-written clipping and Adam against torch's own, step for step
    agent, params, adam = fresh(module)
    reference = module.Agent(11, 3)
    reference.load_state_dict(agent.state_dict())
    optimizer = torch.optim.Adam(reference.parameters(), lr=3e-3, eps=1e-5)
    args, flat = module.Args(max_grad_norm=0.2), random_flat()
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        indices = torch.randperm(256, generator=g)[:64]
        module.train_step(params, adam, flat, indices, rate(module, 3e-3), agent, args)
        mb = {key: value[indices] for key, value in flat.items()}
        loss, _ = module.minibatch_loss(dict(reference.named_parameters()), reference, mb, args)
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), args.max_grad_norm)
        optimizer.step()
    assert norm > args.max_grad_norm  # the clip acted
    for got, want in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert adam["step"].item() == 10


@script
def test_eager_gradient_is_the_one_the_compiler_traces(module, monkeypatch):
    # Eagerly train_step takes torch.autograd.grad; under torch.compile, torch.func.grad. Run on this
    # machine, both paths eagerly (is_compiling patched to say yes) give the very same steps.
    (agent, params, adam), (agent_func, params_func, adam_func) = fresh(module), fresh(module)
    args, flat = module.Args(max_grad_norm=0.2), random_flat()
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        indices = torch.randperm(256, generator=g)[:64]
        stats = module.train_step(params, adam, flat, indices, rate(module, 3e-3), agent, args)
        with monkeypatch.context() as patch:
            patch.setattr(torch.compiler, "is_compiling", lambda: True)
            stats_func = module.train_step(params_func, adam_func, flat, indices, rate(module, 3e-3), agent_func, args)
        for name in stats:
            assert torch.equal(stats[name], stats_func[name]), name
    for name in params:
        assert torch.equal(params[name], params_func[name]), name
    assert not torch.equal(params["actor.logstd"], fresh(module)[1]["actor.logstd"])  # the steps moved it


@script
def test_compiled_update_agrees_with_eager(module):
    # Inductor fuses and reorders float operations, so the two agree to rounding, not bit for bit.
    (agent, params, adam), (agent_eager, params_eager, adam_eager) = fresh(module), fresh(module)
    args, flat = module.Args(), random_flat()
    compiled = torch.compile(module.train_step, fullgraph=True)  # as main compiles it
    lr = rate(module, 3e-4)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        indices = torch.randperm(256, generator=g)[:64]
        anneal(lr, 3e-4 * (1 - step / 6))  # annealing: a new value, the same compiled program
        stats = compiled(params, adam, flat, indices, lr, agent, args)
        stats_eager = module.train_step(params_eager, adam_eager, flat, indices, lr, agent_eager, args)
        assert stats.keys() == stats_eager.keys()
        for name in stats:
            torch.testing.assert_close(stats[name], stats_eager[name], rtol=1e-4, atol=1e-5, msg=name)
    for name in params:
        torch.testing.assert_close(params[name], params_eager[name], rtol=1e-5, atol=1e-6)
        assert not torch.equal(params[name], fresh(module)[1][name])  # it trained
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    torch._dynamo.reset()


def compile_failing_with(monkeypatch, error):
    """torch.compile replaced by one whose programs raise `error` at their first call (where compiling happens)."""
    def compile(fn, **kwargs):
        def call(*args):
            raise error
        return call

    monkeypatch.setattr(torch, "compile", compile)


def test_a_failed_compile_says_so_and_runs_eagerly(monkeypatch, capsys):
    # what torch.compile raises when its backend cannot build a program (no C++ compiler, say): the
    # choice is made once, before training, and the step itself runs eagerly from the start
    compile_failing_with(monkeypatch, torch._inductor.exc.InductorError(RuntimeError("no working C++ compiler\n(details)"),
                                                                        None))
    step = lambda *args: "eager"  # noqa: E731
    assert vaco_continuous.compiled_or_eager(step, enabled=True) is step
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one line, once
    assert out.startswith("note: torch.compile failed (RuntimeError: no working C++ compiler)")


def test_an_error_of_the_step_itself_is_raised(monkeypatch, capsys):
    # a bug in the loss is not a compile failure: the probe compiles, the step's own error surfaces
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)

    def step(*args):
        raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="shapes do not match"):
        vaco_continuous.compiled_or_eager(step, enabled=True)(1)
    assert "note:" not in capsys.readouterr().out


def test_no_compile_is_the_step_itself(capsys):
    step = lambda *args: None  # noqa: E731
    assert vaco_continuous.compiled_or_eager(step, enabled=False) is step and capsys.readouterr().out == ""


def test_the_compiled_run_learns_as_the_eager_one(train, capsys):
    # a whole tiny run each way: the first update's losses agree to rounding
    _, eager = train(vaco_continuous, exp_name="eager")
    _, compiled = train(vaco_continuous, exp_name="compiled", compile=True)
    assert "compiling the update step at the first update" in capsys.readouterr().out
    assert eager["charts/episodic_return"][:3] == compiled["charts/episodic_return"][:3]  # the same first rollout
    for tag in ["losses/policy_loss", "losses/value_loss", "losses/approx_kl", "losses/filter_tv"]:
        np.testing.assert_allclose(compiled[tag][0], eager[tag][0], rtol=1e-4, atol=1e-6, err_msg=tag)
