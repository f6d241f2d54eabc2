"""benchmark/study/narrowing.py on CSVs written here: its tables by snapshot age and per update, and its report."""

import pytest

from benchmark.common import write_csv
from benchmark.study import lag_by_age, narrowing

pytestmark = pytest.mark.floatfree  # the tables and report, in numpy, of CSVs written here


def rows_of(updates, ages):
    """lag_by_age.py's rows: per update, each age with 10 samples whose mean advantage is -age/10 and |z| 0.8 + age/10,
    pushing the log-std by -age; the batch's row adds the entropy's changes and the policy's move."""
    rows = []
    for update in updates:
        for age in ages:
            rows.append(dict(update=update, step=2048 * update, age=str(age), samples=10, advantage_mean=-age / 10,
                             abs_z_mean=0.8 + age / 10, weight_mean=1.0, logstd_push=-float(age),
                             logstd_push_centred=-age / 2, entropy=5.0))
        wider = update % 2 == 0  # every other update's first step pushes wider, and its entropy still falls
        rows.append(dict(update=update, step=2048 * update, age="all", samples=10 * len(ages), advantage_mean=0.0,
                         abs_z_mean=0.8, weight_mean=1.0, logstd_push=1.0 if wider else -float(sum(ages)),
                         logstd_push_centred=-1.0, entropy=5.0 - update / 100, move_kl_mean=0.02, move_kl_std=0.001,
                         entropy_change_first_epoch=-0.001, entropy_change=-0.01))
    return rows


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(narrowing, "FOLDER", str(tmp_path))
    write_csv(narrowing.csv_path("Hopper-v4", "ppo-decoupled", 32), rows_of(range(1, 300), range(0, 32)),
              lag_by_age.COLUMNS)
    write_csv(narrowing.csv_path("Hopper-v4", "ppo", 1), rows_of(range(1, 300), [0]), lag_by_age.COLUMNS)
    return tmp_path


def test_by_age_groups_the_ages_and_weighs_by_samples(folder):
    table = narrowing.by_age(narrowing.load("Hopper-v4", "ppo-decoupled", 32))
    assert [b["ages"] for b in table] == ["0", "1–3", "4–7", "8–15", "16–23", "24–31"]
    assert sum(b["share"] for b in table) == pytest.approx(1.0)
    assert table[1]["share"] == pytest.approx(3 / 32) and table[1]["advantage"] == pytest.approx(-0.2)
    assert table[5]["abs_z"] == pytest.approx(0.8 + 2.75)
    # the ages' pushes over the batch's: on the odd updates the batch's push is the ages' sum, on the even ones +1
    updates = range(narrowing.FIRST, narrowing.LAST + 1)
    batch = sum(1.0 if u % 2 == 0 else -sum(range(32)) for u in updates)
    assert table[0]["push"] == 0.0 and table[2]["push"] == pytest.approx(-sum(range(4, 8)) * len(updates) / batch)


def test_per_update_reads_the_batch_rows_of_the_window(folder):
    u = narrowing.per_update(narrowing.load("Hopper-v4", "ppo", 1))
    assert u["first_epoch"] == pytest.approx(-0.001) and u["update"] == pytest.approx(-0.01)
    assert u["fell_when_wider"] == 1.0 and u["kl_mean"] == pytest.approx(0.02) and u["kl_std"] == pytest.approx(0.001)


def test_the_report_names_the_runs_not_made_and_draws_its_figure(folder):
    lines = narrowing.report()
    assert any("Not run yet" in line and "Walker2d-v4__ppo-decoupled__K32.csv" in line for line in lines)
    assert sum(line.startswith("| Hopper-v4 | decoupled PPO | ") for line in lines) == 6 + 1  # six age groups, one update row
    assert (folder / "narrowing.png").stat().st_size > 10_000
