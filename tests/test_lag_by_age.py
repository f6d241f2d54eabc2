"""benchmark/study/lag_by_age.py: a run it instruments trains exactly as the script alone does, each sample's part of
the log-std gradient sums to the parameter's gradient, and its per-update numbers agree with one another."""

import csv
import glob
import os

import pytest
import torch

import decoupled_ppo_continuous as decoupled
from benchmark.common import write_csv
from benchmark.study import lag_by_age
from conftest import ROOT, TINY, read_scalars

SETTINGS = dict(TINY, total_timesteps=512, policy_buffer=3)  # 4 updates, ages 0-2


@pytest.fixture
def instrumented(tmp_path, monkeypatch):
    """The rows of an instrumented run of decoupled_ppo_continuous.py at SETTINGS, and its TensorBoard scalars."""
    monkeypatch.chdir(tmp_path)
    module = lag_by_age.import_script(os.path.join(ROOT, "decoupled_ppo_continuous.py"),
                                       "decoupled_ppo_continuous_instrumented")
    rows = []
    lag_by_age.instrument(module, rows)
    module.main(module.Args(**SETTINGS, exp_name="instrumented"))  # its own run folder beside the plain run's
    write_csv("ages.csv", rows, lag_by_age.COLUMNS)
    (run_dir,) = glob.glob("runs/*")
    with open("ages.csv") as f:
        return list(csv.DictReader(f)), read_scalars(run_dir)


def test_an_instrumented_run_trains_as_the_script_alone(instrumented, train):
    _, scalars = instrumented
    _, plain = train(decoupled, exp_name="plain", total_timesteps=512, policy_buffer=3)
    for tag in ("losses/policy_loss", "losses/entropy", "charts/episodic_return", "charts/backward_ratio_max"):
        assert scalars[tag] == plain[tag]


def test_rows_per_age_add_up_to_the_batch_and_follow_the_entropy(instrumented):
    rows, _ = instrumented
    updates = sorted({int(row["update"]) for row in rows})
    assert updates == [1, 2, 3, 4]
    whole = [row for row in rows if row["age"] == "all"]
    for update, row in zip(updates, whole):
        parts = [r for r in rows if int(r["update"]) == update and r["age"] != "all"]
        assert sum(int(r["samples"]) for r in parts) == int(row["samples"]) == 128
        assert sum(float(r["logstd_push"]) for r in parts) == pytest.approx(float(row["logstd_push"]), abs=1e-5)
        assert {int(r["age"]) for r in parts} <= {0, 1, 2}
    assert [r["age"] for r in rows if r["update"] == "1"] == ["0", "all"]  # one snapshot held at the start
    for before, after in zip(whole, whole[1:]):  # entropy_change: this update's start to the next one's
        assert float(before["entropy_change"]) == pytest.approx(float(after["entropy"]) - float(before["entropy"]),
                                                                abs=1e-4)
    assert float(whole[0]["move_kl_mean"]) == 0.0 and float(whole[1]["move_kl_mean"]) > 0.0


def test_each_sample_s_push_sums_to_minus_the_log_std_gradient():
    torch.manual_seed(0)
    agent, n = decoupled.Agent(4, 2), 32
    g = torch.Generator().manual_seed(1)
    behaviour = -torch.rand(n, generator=g) - 2
    flat = dict(obs=torch.randn(n, 4, generator=g), actions=torch.randn(n, 2, generator=g), behaviour_logprobs=behaviour,
                proximal_logprobs=behaviour + 0.2 * torch.randn(n, generator=g), returns=torch.randn(n, generator=g),
                values=torch.randn(n, generator=g), ages=torch.zeros(n))
    advantages = torch.randn(n, generator=g)
    args = decoupled.Args()
    push = lag_by_age.per_sample_logstd_push(decoupled, agent, flat, args, advantages)
    params = {name: p.detach().requires_grad_() for name, p in agent.named_parameters()}
    loss, _ = decoupled.minibatch_loss(params, agent, {**flat, "advantages": advantages}, args)
    (grad,) = torch.autograd.grad(loss, [params["actor.logstd"]])
    assert push.sum().item() == pytest.approx(-grad.sum().item(), rel=1e-5)


def test_centring_by_age_leaves_each_age_with_mean_zero():
    advantages, ages = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0]), torch.tensor([0, 0, 0, 1, 1])
    assert lag_by_age.centred_by_age(advantages, ages).tolist() == [-1.0, 0.0, 1.0, -5.0, 5.0]
