"""The study runner (benchmark/study/run.py) and its analysis (benchmark/study/analyze.py), on small
synthetic results whose scores and aggregates are known, and one tiny real run."""

import collections
import csv
import dataclasses
import importlib
import itertools
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tyro

from benchmark.common import import_script, move_stale, script_at, write_csv
from benchmark.study import analyze, estimates, plotting, presets, scores
from benchmark.study import run as runner
from benchmark.study.report import incomplete_line
from benchmark.study.sections import baselines, diagnostics, summary_number, vaco_vs_ppo, window

pytestmark = pytest.mark.floatfree  # the runner, and the analysis in numpy of results it is given


def write_run(folder, task, algorithm, k, seed, returns, steps_per_update=1000, episodes=None, **meta):
    """A finished run in the study's format: one update per entry of `returns` (one episode each,
    or `episodes[i]`); `meta` adds to its JSON (e.g. the seconds it took)."""
    run = presets.Run(task, algorithm, k, seed, steps_per_update * len(returns))
    episodes = episodes or [1] * len(returns)
    rows = [{"step": steps_per_update * (i + 1), "episodes": n, "return_mean": float(r) if n else ""}
            for i, (r, n) in enumerate(zip(returns, episodes))]
    write_csv(os.path.join(folder, run.name + ".csv"), rows, runner.COLUMNS)
    with open(os.path.join(folder, run.name + ".json"), "w") as f:
        json.dump(dict(command=run.portable_command(), task=task, algorithm=algorithm, k=k, seed=seed,
                       total_timesteps=run.steps, **meta), f)
    return run


RANDOMS = {"TaskA-v4": 0.0, "TaskB-v4": 100.0}


def study_folder(tmp_path, randoms=RANDOMS):
    """A results folder with known random-policy returns (no env is run to measure them)."""
    with open(os.path.join(tmp_path, "random_scores.json"), "w") as f:
        json.dump(randoms, f)
    return str(tmp_path), randoms


@pytest.fixture
def saved(monkeypatch):
    """{path: figure} of every figure plotting.save writes during the test (and still writes it)."""
    figures, save = {}, plotting.save
    monkeypatch.setattr(plotting, "save", lambda fig, path: (figures.__setitem__(path, fig), save(fig, path)))
    return figures


# --- scores -------------------------------------------------------------------------------------

def test_slice_scores_final_and_auc():
    # 20 updates of 1000 steps, 10 slices of 2000 steps: updates 2i+1, 2i+2 fall in slice i
    rows = [{"step": 1000 * (i + 1), "episodes": 2 if i % 2 else 1, "return_mean": float(i)} for i in range(20)]
    sliced = scores.slice_scores(rows, 20_000)
    # slice i holds update 2i (1 episode, return 2i) and update 2i+1 (2 episodes, return 2i+1)
    np.testing.assert_allclose(sliced, [(2 * i + 2 * (2 * i + 1)) / 3 for i in range(10)])
    s = scores.run_scores({"total_timesteps": 20_000}, rows)
    assert s["final"] == pytest.approx(sliced[-1]) and s["auc"] == pytest.approx(sliced.mean())


def test_a_slice_without_episodes_is_left_out_of_the_auc():
    rows = [{"step": 1000, "episodes": 1, "return_mean": 10.0}, {"step": 2000, "episodes": 0, "return_mean": ""},
            {"step": 4000, "episodes": 1, "return_mean": 40.0}]
    sliced = scores.slice_scores(rows, 4000, slices=4)
    assert sliced[0] == 10.0 and np.isnan(sliced[1]) and sliced[3] == 40.0
    assert scores.run_scores({"total_timesteps": 4000}, rows)["final"] == 40.0


def test_normalisation():
    assert scores.normalise(150.0, random_score=50.0, reference_score=250.0) == pytest.approx(0.5)
    assert scores.normalise(-20.0, random_score=-100.0, reference_score=-60.0) == pytest.approx(2.0)


def test_iqm_of_a_known_array_and_seeded_intervals():
    scores = np.arange(1.0, 9.0).reshape(8, 1)  # 8 runs, 1 task: IQM = mean(3, 4, 5, 6)
    points, intervals = estimates.aggregates({"a": scores}, reps=200, seed=0)
    median, iqm, mean, gap = points["a"]
    assert (median, iqm, mean) == pytest.approx((4.5, 4.5, 4.5))
    assert gap == pytest.approx(0.0)  # every score is >= 1: no gap to "as good as the reference"
    _, again = estimates.aggregates({"a": scores}, reps=200, seed=0)
    np.testing.assert_array_equal(intervals["a"], again["a"])  # same data and seed, same intervals
    assert intervals["a"][0, 1] < 4.5 < intervals["a"][1, 1]


def test_probability_of_improvement_of_a_dominating_algorithm():
    better, worse = np.full((3, 2), 2.0), np.full((3, 2), 1.0)
    points, _ = estimates.probability_of_improvement({"x,y": (better, worse)}, reps=100, seed=0)
    assert points["x,y"] == pytest.approx(1.0)


def test_probability_of_improvement_is_rliables_number_for_number():
    # the pair count gives the very float rliable's Mann-Whitney U gives, ties (half a pair each),
    # identical arrays (0.5) and runs of unequal number included, so every report's P(X > Y) stands
    from rliable import metrics

    rng = np.random.default_rng(0)
    for case in range(300):
        runs_x, runs_y, tasks = rng.integers(1, 6, size=3)
        x = rng.integers(0, 4, size=(runs_x, tasks)) * 0.1  # few values: ties are common
        y = x.copy() if case % 4 == 0 else rng.integers(0, 4, size=(runs_y, tasks)) * 0.1
        if case % 5 == 0:
            x, y = rng.normal(size=x.shape), rng.normal(size=y.shape)
        assert estimates.improvement(x, y) == metrics.probability_of_improvement(x, y), (x, y)
    # by hand: task 1, 1 beats 0 and not 3 (1/2); task 2, 2 ties 2 and beats 1 (1.5/2)
    assert estimates.improvement(np.array([[1.0, 2.0]]), np.array([[0.0, 2.0], [3.0, 1.0]])) == (0.5 + 0.75) / 2


def test_analysis_end_to_end(tmp_path):
    folder, randoms = study_folder(tmp_path)
    for seed in (1, 2, 3):
        for task, base in randoms.items():
            write_run(folder, task, "ppo", 1, seed, [base + 10 * seed] * 10)  # PPO K=1 mean: base + 20
            write_run(folder, task, "ppo", 8, seed, [base + 5 * seed] * 10)  # half as far above random
            write_run(folder, task, "vaco", 1, seed, [base + 20] * 10)
            write_run(folder, task, "vaco", 8, seed, [base + 30] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    raw, normalised = scores.score_table(scores.load_runs(folder), randoms)
    assert normalised[("ppo", 8)]["TaskB-v4"][2]["final"] == pytest.approx(10 / 20)
    assert normalised[("vaco", 8)]["TaskA-v4"][1]["final"] == pytest.approx(1.5)
    report = open(os.path.join(folder, "report.md")).read()
    assert "| vaco | 8 | 3 | 1.50 [1.50, 1.50]" in report  # median with its (degenerate) interval
    assert "| ppo | 8 | 1.00 [1.00, 1.00] |" in report  # P(VACO > PPO) at K = 8
    # per task: PPO K=1 on TaskA is 10, 20, 30: mean 20 ± t(0.975, 2) * 10 / sqrt(3) = 20 ± 24.8; VACO/PPO
    # above random is 20 / 20 at K = 1 and 30 / 10 at K = 8
    assert "| TaskA-v4 | 20 [-5, 45] | 20 [20, 20] | 1.00 | 10 [-2, 22] | 30 [30, 30] | 3.00 |" in report
    # the paper's summary at K = 8: mean of (30 - 10) / 10 and (130 - 110) / 110; above random: 2 on both
    assert "| mean relative to PPO's return | +0.0 % [" in report and "| +109.1 % [" in report
    assert "| mean above random | +0.0 % [" in report and "| +200.0 % [" in report
    for section in ("per_task", "vaco_vs_ppo", "summary_number", "diagnostics", "aggregates_final", "aggregates_auc",
                    "improvement"):  # for the docs to include
        assert f"<!-- --8<-- [start:{section}] -->" in report and f"<!-- --8<-- [end:{section}] -->" in report
    for figure in ("lag_robustness.png", "aggregates_K1.png", "aggregates_K8.png", "learning_curves.png"):
        assert os.path.getsize(os.path.join(folder, figure)) > 1000
    assert "start:baselines" not in report  # PPO and VACO only: no baselines section
    # a page that includes a section gives it a heading: the section carries none (a heading in it
    # would repeat in the page's table of contents when two reports' sections are included)
    inside = False
    for line in report.splitlines():
        inside = (inside or "--8<-- [start:" in line) and "--8<-- [end:" not in line
        assert not (inside and line.startswith("#")), f"a heading inside a snippet section: {line!r}"
    assert "### Aggregates, final score\n\n<!-- --8<-- [start:aggregates_final] -->" in report


def test_the_median_improvement_is_not_carried_by_one_task_far_ahead():
    finals = {"TaskA-v4": (110.0, 100.0), "TaskB-v4": (120.0, 100.0), "TaskC-v4": (600.0, 100.0)}  # VACO, PPO
    runs = [(dict(task=task, algorithm=algorithm, k=8, seed=seed, total_timesteps=10),
             [dict(step=10, episodes=1, return_mean=final + seed)])
            for task, pair in finals.items() for algorithm, final in zip(("vaco", "ppo"), pair) for seed in (-1, 1)]
    randoms = dict.fromkeys(finals, 0.0)
    raw, _ = scores.score_table(runs, randoms)
    (mean, median, above), intervals = summary_number.relative_improvement(raw, randoms, list(finals), 8, reps=100, seed=0)
    assert (mean, median, above) == pytest.approx(((0.1 + 0.2 + 5.0) / 3, 0.2, (0.1 + 0.2 + 5.0) / 3))
    assert intervals.shape == (2, 3) and np.all(intervals[0] <= np.array([mean, median, above]) + 1e-12)
    lines = summary_number.section(analyze.study_of(runs, randoms, reps=100))
    assert any(line.startswith("| median relative to PPO's return | +20.0 % [") for line in lines)


def test_an_added_seed_enters_the_report_once_it_is_in_on_every_task():
    # seeds 1-3 of PPO at K = 1 planned by one preset, 4 and 5 added by another (MORE_SEEDS): seed 4 is in on TaskA only,
    # so it is left out, whole, and the header says what is still running; once in on TaskB too it counts everywhere
    def run(task, seed, final):
        return {"task": task, "algorithm": "ppo", "k": 1, "seed": seed, "total_timesteps": 10}, \
            [{"step": i + 1, "episodes": 1, "return_mean": final} for i in range(10)]

    tasks, randoms = ("TaskA-v4", "TaskB-v4"), {"TaskA-v4": 0.0, "TaskB-v4": 0.0}
    base = {(t, "ppo", 1, s) for t in tasks for s in (1, 2, 3)}
    added = {(t, "ppo", 1, s) for t in tasks for s in (4, 5)}
    runs = [run(t, s, 100) for t in tasks for s in (1, 2, 3)] + [run("TaskA-v4", 4, 400)]
    study = analyze.study_of(runs, randoms, planned=base | added, added=added)
    assert sorted(study.raw[("ppo", 1)]["TaskA-v4"]) == [1, 2, 3] and len(study.runs) == 6
    assert scores.reference_scores(study.raw)["TaskA-v4"]["final"] == 100  # seed 4's 400 moves no number
    assert study.waiting == {("ppo", 1): ([4, 5], 1, 4)}
    assert ("Still running, and in no number here until a seed is in for all of them on every task: seeds 4, 5 of "
            "PPO at K = 1 "
            "(1 of 4 runs in).") in analyze.header(study)
    study = analyze.study_of(runs + [run("TaskB-v4", 4, 400)], randoms, planned=base | added, added=added)
    assert sorted(study.raw[("ppo", 1)]["TaskB-v4"]) == [1, 2, 3, 4]
    assert scores.reference_scores(study.raw)["TaskA-v4"]["final"] == 175  # (3 x 100 + 400) / 4
    assert study.waiting == {("ppo", 1): ([5], 0, 2)}
    assert "seed 5 of PPO at K = 1 (0 of 2 runs in)" in analyze.header(study)[4]
    # a seed added to two blocks enters both at once: VACO's seed 4 missing on TaskB keeps PPO's out too
    added |= {(t, "vaco", 1, 4) for t in tasks}
    study = analyze.study_of(runs + [run("TaskB-v4", 4, 400)], randoms, planned=base | added, added=added)
    assert sorted(study.raw[("ppo", 1)]["TaskB-v4"]) == [1, 2, 3] and ("vaco", 1) not in study.raw
    assert study.waiting[("ppo", 1)] == ([4, 5], 2, 4) and study.waiting[("vaco", 1)] == ([4], 0, 2)
    # the ten tasks' folder: seeds 4-10 of the four cells are added, one seed at a time
    added = presets.planned_runs(os.path.join("benchmark", "results", "ten-tasks"), presets.MORE_SEEDS)
    assert {(a, k) for _, a, k, _ in added} == {("ppo", 1), ("ppo", 8), ("vaco", 8), ("ppo-decoupled", 8)}
    assert {s for *_, s in added} == set(range(4, 11)) and len(added) == 280


def test_what_moved_sets_each_answer_on_the_first_seeds_beside_all():
    # seeds 1-3 of every method, then seed 4 added to synchronous PPO, PPO, VACO and decoupled PPO at K = 8: VACO's
    # seed 4 is far ahead on both tasks, so its IQM moves up, while GePPO keeps its 3 seeds (and moves only through
    # synchronous PPO's mean); until seed 4 is in for every method on every task, there is nothing to set side by side
    from benchmark.study.sections import what_moved

    def run(task, algorithm, k, seed, final):
        return {"task": task, "algorithm": algorithm, "k": k, "seed": seed, "total_timesteps": 10}, \
            [{"step": i + 1, "episodes": 1, "return_mean": final} for i in range(10)]

    tasks, randoms = ("TaskA-v4", "TaskB-v4"), {"TaskA-v4": 0.0, "TaskB-v4": 0.0}
    first = {("ppo", 1): 100, ("vaco", 1): 100, ("ppo", 8): 60, ("vaco", 8): 70, ("ppo-decoupled", 8): 90,
             ("geppo", 8): 80}
    runs = [run(t, a, k, s, final + s) for (a, k), final in first.items() for t in tasks for s in (1, 2, 3)]
    added_cells = [("ppo", 1), ("ppo", 8), ("vaco", 8), ("ppo-decoupled", 8)]
    added = {(t, a, k, 4) for a, k in added_cells for t in tasks}
    plan = {(t, a, k, s) for (a, k) in first for t in tasks for s in (1, 2, 3)} | added
    seed_4 = [run(t, a, k, 4, {"vaco": 100}.get(a, first[(a, k)])) for a, k in added_cells for t in tasks]
    study = analyze.study_of(runs + seed_4[:-1], randoms, planned=plan, added=added, reps=100)
    assert what_moved.section(study) == "no added seed is in for every method on every task yet"
    lines = what_moved.section(analyze.study_of(runs + seed_4, randoms, planned=plan, added=added, reps=100))
    assert "| method | IQM, 3 seeds | width | IQM, 4 seeds | width | lag won back, 3 | 4 | clearly behind, 3 | 4 |" \
        in lines
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines if line.startswith("| ") and "[" in line}
    # VACO's IQM: (70 + s) / 102 on seeds 1-3, synchronous PPO's mean 102; with seed 4 (100) the mean is 101.5
    assert rows["VACO"][0].startswith("0.71 [") and rows["VACO"][2] != rows["VACO"][0]
    assert "GePPO (3 seeds)" in rows and rows["GePPO (3 seeds)"][0] != rows["GePPO (3 seeds)"][2]
    assert any(line.startswith("| median over tasks | +") for line in lines)


def test_a_cell_of_one_seed_shows_its_return_without_an_interval():
    runs = [(dict(task="TaskA-v4", algorithm=algorithm, k=1, seed=seed, total_timesteps=10),
             [dict(step=10, episodes=1, return_mean=final)]) for algorithm, seed, final in
            [("ppo", 1, 20.0), ("ppo", 2, 40.0), ("vaco", 1, 45.0)]]
    lines = vaco_vs_ppo.section(analyze.study_of(runs, {"TaskA-v4": 0.0}))
    assert "| TaskA-v4 | 30 [-97, 157] | 45 (1 seed) | 1.50 |" in lines  # 30 ± t(0.975, 1) * 14.1 / sqrt(2)


def test_diagnostics_are_shown_beside_ppo_and_rows_where_vaco_is_behind_are_bold():
    def run(algorithm, k, final, **columns):
        meta = dict(task="TaskA-v4", algorithm=algorithm, k=k, seed=1, total_timesteps=10)
        return meta, [dict(step=10, episodes=1, return_mean=final, **columns)]

    runs = [run("ppo", 1, 20.0, approx_kl=0.01, entropy=1.5), run("vaco", 1, 30.0, approx_kl=0.02, entropy=1.0),
            run("ppo", 8, 20.0, approx_kl=0.05), run("vaco", 8, 10.0, approx_kl=0.03, filter_on_fraction=0.25,
                                                      filtered_fraction=0.1, backward_tv=0.2)]
    lines = diagnostics.section(analyze.study_of(runs, {"TaskA-v4": 0.0}))
    assert "| TaskA-v4 | 1 | 1.50 | 1/1 |  |  | 0.02 | 0.01 | 1 | 1.5 |  |" in lines
    assert "| **TaskA-v4** | 8 | 0.50 | 0/1 | 0.25 | 0.1 | 0.03 | 0.05 |  |  | 0.2 |" in lines


def lag_study_folder(tmp_path):
    """TaskA and TaskB: lag hurts PPO (it keeps 22 % and 50 % of its K = 1 return above random); VACO wins
    back 25 % of the loss on TaskA and falls 45 % of it behind on TaskB, decoupled PPO wins back 50 % and
    100 %. TaskC: lag costs PPO nothing. Every run's seeds spread its returns by 1."""
    folder, randoms = study_folder(tmp_path, {"TaskA-v4": 0.0, "TaskB-v4": 100.0, "TaskC-v4": 0.0})
    means = {"TaskA-v4": dict(ppo1=102, ppo8=22, vaco8=42, decoupled8=62),
             "TaskB-v4": dict(ppo1=302, ppo8=202, vaco8=157, decoupled8=302),
             "TaskC-v4": dict(ppo1=52, ppo8=52, vaco8=52, decoupled8=52)}
    for task, m in means.items():
        for seed in (1, 2, 3):
            for algorithm, k, mean in (("ppo", 1, m["ppo1"]), ("vaco", 1, m["ppo1"]), ("ppo", 8, m["ppo8"]),
                                       ("vaco", 8, m["vaco8"]), ("ppo-decoupled", 8, m["decoupled8"])):
                write_run(folder, task, algorithm, k, seed, [mean - 2 + seed] * 10)
    return folder, randoms


def test_the_share_of_the_lag_loss_won_back_on_the_tasks_where_lag_hurts(tmp_path, saved):
    folder, _ = lag_study_folder(tmp_path)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    report = open(os.path.join(folder, "report.md")).read()
    section = report[report.index("[start:lag_recovered]"):report.index("[end:lag_recovered]")]
    assert "below 0.9 of its mean at K = 1, both measured above the random policy: TaskA-v4, TaskB-v4." in section
    cells = [[c.strip(" *") for c in line.strip().strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ")]
    rows = {row[0]: row[1:] for row in cells}
    assert "TaskC-v4" not in rows  # lag costs PPO nothing there
    assert rows["TaskA-v4"][0] == "0.22" and rows["TaskB-v4"][0] == "0.50"  # PPO K=8 / K=1 above random
    assert rows["TaskA-v4"][1].startswith("0.25 [") and rows["TaskA-v4"][2].startswith("0.50 [")
    assert rows["TaskB-v4"][1].startswith("-0.45 [") and rows["TaskB-v4"][2].startswith("1.00 [")
    mean = rows["mean over these 2 tasks"]
    assert mean[1].startswith("-0.10 [") and mean[2].startswith("0.75 [")
    assert rows["median over these 2 tasks"][2].startswith("0.75 [")  # of two tasks: their mean
    lo, hi = (float(x) for x in mean[2].split(" ", 1)[1].strip("[]").split(", "))
    assert lo < 0.75 < hi  # the seeds' spread gives the interval its width
    # decoupled PPO beats PPO in every pairing of runs on TaskA and TaskB; VACO in half of the tasks
    assert rows["P(X > PPO) at K=8, these tasks"][2].startswith("1.00 [")
    assert rows["P(X > PPO) at K=8, these tasks"][1].startswith("0.50 [")
    assert "| P(X > PPO) at K=8, all 3 tasks |" in section
    # the per-task table carries decoupled PPO at K = 8 beside VACO
    assert "| task | PPO K=1 | VACO K=1 | VACO/PPO K=1 | PPO K=8 | VACO K=8 | VACO/PPO K=8 | decoupled PPO K=8 | " \
           "decoupled PPO/PPO K=8 |" in report
    # the disagreement table: bold where one is ahead of PPO and the other behind (TaskB)
    diagnostics = report[report.index("[start:decoupled_diagnostics]"):report.index("[end:decoupled_diagnostics]")]
    assert "| **TaskB-v4** | 0.56 | 1.98 |" in diagnostics and "| TaskA-v4 | 1.91 | 2.82 |" in diagnostics
    figure = saved[os.path.join(folder, "lag_recovered.png")]
    readable(figure)
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["median over 2 tasks", "mean over 2 tasks",
                                                                        "TaskA-v4", "TaskB-v4"]
    # the axis holds -1.5 to 3; an interval past it ends in an arrowhead at the edge, never cut silently
    ax = figure.axes[0]
    assert ax.get_xlim() == (-1.5, 3.0)
    arrows = [line for line in ax.get_lines() if line.get_marker() in ("<", ">")]
    ends = [(line.get_xdata()[0], line.get_marker()) for line in arrows]
    assert all((x, m) in ((-1.5, "<"), (3.0, ">")) for x, m in ends)


def write_csv_columns(folder, task, algorithm, seed, k=8, **columns):
    """Add per-update diagnostic columns to a run written by write_run."""
    path = os.path.join(folder, presets.Run(task, algorithm, k, seed, 0).name + ".csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for name, values in columns.items():
        for row, value in zip(rows, values):
            row[name] = value
    write_csv(path, rows, runner.COLUMNS)


def trust_region_folder(tmp_path):
    """Three tasks where lag hurts PPO (K = 1: 100 above random, K = 8: 20), and the methods under lag at K = 8
    with 3 seeds spreading returns by 1: decoupled PPO wins back all of the loss on every task, V-trace under
    its clip a quarter on TaskA and TaskB and all on TaskC, VACO half, GePPO falls behind PPO on TaskC (5 below
    it) and wins back all elsewhere; VACO against pi_T has 3 seeds but GePPO with GAE only one."""
    folder, randoms = study_folder(tmp_path, {"TaskA-v4": 0.0, "TaskB-v4": 0.0, "TaskC-v4": 0.0})
    gains = {"ppo-decoupled": [80, 80, 80], "vtrace-decoupled": [20, 20, 80], "vaco": [40, 40, 40],
             "vaco-proximal-0.1": [40, 40, 40], "geppo": [80, 80, -5]}
    for i, task in enumerate(randoms):
        for seed in (1, 2, 3):
            write_run(folder, task, "ppo", 1, seed, [100 - 2 + seed] * 10)
            write_run(folder, task, "ppo", 8, seed, [20 - 2 + seed] * 10)
            for algorithm, gain in gains.items():
                write_run(folder, task, algorithm, 8, seed, [20 + gain[i] - 2 + seed] * 10)
            # GePPO's logs: its actor's rate, annealed over 10 updates and lowered 1.03^-4 by the last
            write_csv_columns(folder, task, "geppo", seed, actor_learning_rate=[3e-4 * (1 - u / 10) * (1.03 ** -min(u, 4))
                                                                                 for u in range(10)], backward_tv=[0.1] * 10)
    write_run(folder, "TaskA-v4", "geppo-gae", 8, 1, [60] * 10)
    return folder


def test_which_part_wins_lag_back_one_variable_at_a_time(tmp_path, saved):
    folder = trust_region_folder(tmp_path)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    report = open(os.path.join(folder, "report.md")).read()
    section = report[report.index("[start:trust_region]"):report.index("[end:trust_region]")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| method") and not line.startswith("| task"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.setdefault(cells[0], []).append(cells[1:])
    # the first table: each method's seeds a task, what it is made of, and its IQM (decoupled PPO: (20 + 80) / 100 = 1)
    assert rows["decoupled PPO"][0][:4] == ["3", "GAE", "decoupled clip: π_θ/π_T, weight π_T/β", "1.00 [0.99, 1.01]"]
    assert rows["GePPO"][0][1] == "V-trace" and rows["PPO"][0][3].startswith("0.20 [")
    assert rows["decoupled PPO"][0][4].startswith("1.00 [")  # P(decoupled PPO > PPO)
    # lag won back: medians over the three tasks, the range, the pairs won, where clearly behind
    assert rows["V-trace + decoupled clip"][1] == [rows["V-trace + decoupled clip"][1][0], "0.25 to 1.00", "27/27",
                                                   "none"]
    assert rows["V-trace + decoupled clip"][1][0].startswith("0.25 [")
    assert rows["GePPO"][1][1:] == ["-0.06 to 1.00", "18/27", "TaskC-v4"]
    # per task, X/PPO at K = 8 and the pairs won, bold where clearly behind: GePPO on TaskC
    task_c = [line for line in section.splitlines() if line.startswith("| TaskC-v4 | ")][0]
    assert "**0.75 (0/9)**" in task_c and "5.00 (9/9)" in task_c  # (15 - 0) / (20 - 0), (100 - 0) / 20
    # one variable at a time: V-trace under decoupled PPO's clip against GAE under it; GePPO with GAE is incomplete
    assert rows["the advantages, GAE → V-trace"][0][:2] == ["decoupled PPO", "V-trace + decoupled clip"]
    # P(V-trace + decoupled clip > decoupled PPO): behind on TaskA and TaskB, a tie on TaskC: (0 + 0 + 1/2) / 3
    assert rows["the advantages, GAE → V-trace"][0][2].startswith("0.17 [")
    assert len(rows["the advantages, GAE → V-trace"]) == 1
    assert rows["the trust region, all with V-trace"][2][:2] == ["V-trace + decoupled clip", "GePPO"]
    assert rows["the trust region, all with V-trace"][2][4] == "TaskC-v4"  # either side of PPO there
    assert "Incomplete at K = 8, in no table here: GePPO with GAE (1 of 9 runs)." in section
    # nor in the per-task returns: the block still running is named below that table instead
    per_task = report[report.index("[start:vaco_vs_ppo]"):report.index("[end:vaco_vs_ppo]")]
    assert "GePPO K=8" in per_task and "GePPO with GAE K=8" not in per_task
    assert "Incomplete at K = 8, in no table here: GePPO with GAE (1 of 9 runs)." in per_task
    # where they disagree (TaskC: GePPO behind PPO, the others ahead): every method's diagnostics
    assert "| TaskC-v4 | GePPO | 0.75 | 0.1 |  |  |  | 0.89 |" in section  # 1.03^-4
    assert "| TaskA-v4 | GePPO |" not in section
    figure = saved[os.path.join(folder, "trust_region.png")]
    readable(figure, legend=False)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[0] == "decoupled PPO" and labels[-1] == "PPO"  # the highest IQM first, PPO last for reference
    bars = figure.axes[0].patches
    assert len(bars) == len(labels) - 1 and all(bar.get_x() == pytest.approx(0.20, abs=0.01) for bar in bars), \
        "the bars start at PPO's IQM under the same lag, the baseline of the comparison"


def test_under_lag_which_script_one_statistic_a_cell_in_the_order_it_recommends(tmp_path):
    """The table the README and the results' summary show: every method under lag, ordered by its IQM at K = 8, PPO
    last; one statistic a cell; the commands below the table, a line each in the same order (out of the columns, so
    a laptop and a phone show them whole); a block still running left out and named below."""
    folder = trust_region_folder(tmp_path)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    report = open(os.path.join(folder, "report.md")).read()
    section = report[report.index("[start:which_script]"):report.index("[end:which_script]")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    assert [row[0] for row in rows][0] == "decoupled PPO" and rows[-1][0] == "PPO"
    assert all(row[1] == "3" for row in rows)  # the seeds of each task
    iqms = [float(row[2].split(" ")[0]) for row in rows]
    assert iqms[:-1] == sorted(iqms[:-1], reverse=True)  # the recommendation first
    by_name = {row[0]: row for row in rows}
    assert by_name["decoupled PPO"][2].startswith("1.00 [") and by_name["PPO"][2].startswith("0.20 [")
    assert by_name["V-trace + decoupled clip"][3].startswith("0.25 [")  # the median share, as trust_region's
    assert by_name["GePPO"][4] == "1 of 3 tasks" and by_name["decoupled PPO"][4] == "0 of 3 tasks"
    assert by_name["PPO"][3] == "0 (reference)" and by_name["PPO"][4] == ""
    assert all(len(row) == 5 for row in rows)  # no larger K ran: no column for it; no command in the table
    commands = [line[2:].split(": ", 1) for line in section.splitlines() if line.startswith("- ")]
    assert [name for name, _ in commands] == [row[0] for row in rows]  # the table's order
    commands = dict(commands)
    assert commands["decoupled PPO"] == "`python decoupled_ppo_continuous.py --policy-buffer 8`"
    assert commands["VACO against π_T"] == "`python vaco_continuous.py --policy-buffer 8 --tv-reference proximal`"
    assert commands["GePPO"] == "`python geppo_continuous.py --policy-buffer 8`"  # its flags are its defaults
    assert commands["V-trace + decoupled clip"] == \
        "`python vaco_continuous.py --policy-buffer 8 --no-tv-filter --clip-reference proximal`"
    assert "GePPO with GAE" not in by_name and "GePPO with GAE (1 of 9 runs)" in section


def test_the_seeds_column_says_how_many_each_task_ran():
    # seeds 4-10 come task by task for some methods only: a method's tasks may hold different numbers of seeds
    from benchmark.study.report import seeds_cell
    raw = {("vaco", 8): {"TaskA-v4": {s: {"final": 0.0} for s in range(1, 4)},
                         "TaskB-v4": {s: {"final": 0.0} for s in range(1, 11)}}}
    assert seeds_cell(raw, ("vaco", 8), ["TaskA-v4"]) == "3" and seeds_cell(raw, ("vaco", 8), ["TaskB-v4"]) == "10"
    assert seeds_cell(raw, ("vaco", 8), ["TaskA-v4", "TaskB-v4"]) == "3–10"


def test_a_table_that_sets_three_seeds_beside_five_says_so():
    from benchmark.study.report import seeds_note
    five, three = ({s: {"final": 0.0} for s in range(1, n + 1)} for n in (5, 3))
    raw = {("ppo", 1): {"TaskA-v4": five}, ("ppo", 8): {"TaskA-v4": five}, ("vaco", 8): {"TaskA-v4": five},
           ("vaco", 1): {"TaskA-v4": three}, ("geppo", 8): {"TaskA-v4": three}}
    assert seeds_note(raw, list(raw), ["TaskA-v4"]) == \
        " *Seeds* per task: 5 of PPO at K = 1 and 8, VACO at K = 8; 3 of VACO at K = 1, GePPO at K = 8."
    assert seeds_note(raw, [("ppo", 1), ("vaco", 8), ("ppo", 32)], ["TaskA-v4"]) == ""  # all as many: nothing to say


def test_clearly_behind_is_one_share_at_every_number_of_seeds():
    # at most 2/9 of the pairings won: 2 of 9 at 3 seeds each, 3 of 15 at 3 against 5, 5 of 25 at 5 each, 22 of 100
    from benchmark.study.sections.trust_region import CLEARLY_BEHIND, most_won_when_behind
    assert most_won_when_behind([25, 9, 15, 9, 100]) == "2 of 9, 3 of 15, 5 of 25, 22 of 100"
    assert most_won_when_behind([9, 25], lost=True) == "7 of 9, 20 of 25"
    for n, allowed in ((9, 2), (15, 3), (25, 5), (100, 22)):  # the words say what the rule counts
        assert allowed <= CLEARLY_BEHIND * n < allowed + 1


def test_a_block_counts_when_every_planned_run_is_in():
    raw = {("geppo", 8): {"TaskA-v4": {1: {}, 2: {}}, "TaskB-v4": {1: {}}},  # 3 of the 4 runs planned
           ("vaco-proximal-0.1", 8): {"TaskA-v4": {1: {}, 2: {}}},  # all its runs, planned on TaskA only
           ("vaco", 8): {"TaskA-v4": {1: {}, 2: {}}, "TaskB-v4": {1: {}, 2: {}}}}
    planned = {(t, a, 8, s) for t in ("TaskA-v4", "TaskB-v4") for a in ("geppo", "vaco") for s in (1, 2)}
    planned |= {("TaskA-v4", "vaco-proximal-0.1", 8, s) for s in (1, 2)}
    complete, partial = scores.completeness(raw, ["vaco", "geppo", "vaco-proximal-0.1"], 8, ["TaskA-v4", "TaskB-v4"],
                                             planned)
    assert complete == ["vaco"] and partial == {"geppo": (3, 4)}  # a sweep's variant is neither
    assert incomplete_line(partial, 8)[0] == "Incomplete at K = 8, in no table here: GePPO (3 of 4 runs)."
    # the presets say which runs a folder holds: the ten tasks' folder takes three presets' runs
    planned = presets.planned_runs(os.path.join("benchmark", "results", "ten-tasks"))
    assert ("Ant-v4", "geppo", 8, 3) in planned and ("Ant-v4", "vaco-proximal-0.1", 8, 1) in planned
    assert ("Ant-v4", "ppo", 1, 2) in planned and not presets.planned_runs("somewhere/else")


def test_a_larger_lag_on_fewer_tasks_has_its_own_section(tmp_path, saved):
    # PPO and VACO at K 1 and 8 on three tasks, decoupled PPO at K 8; then K = 32 on two of them: the main sections
    # stay at K = 8 on the three tasks, and K = 32 gets its own, with PPO losing 80 of 100 above random there
    folder, _ = study_folder(tmp_path, {"TaskA-v4": 0.0, "TaskB-v4": 0.0, "TaskC-v4": 0.0})
    finals = {("ppo", 1): 100, ("vaco", 1): 100, ("ppo", 8): 60, ("vaco", 8): 70, ("ppo-decoupled", 8): 100,
              ("ppo", 32): 20, ("vaco", 32): 30, ("ppo-decoupled", 32): 80}
    for (algorithm, k), final in finals.items():
        for task in ("TaskA-v4", "TaskB-v4", "TaskC-v4") if k < 32 else ("TaskA-v4", "TaskB-v4"):
            for seed in (1, 2, 3):
                write_run(folder, task, algorithm, k, seed, [final - 2 + seed] * 10)
                if algorithm == "ppo-decoupled":
                    write_csv_columns(folder, task, algorithm, seed, k=k, backward_ratio_max=[150.0] * 5 + [50.0] * 5,
                                      backward_tv=[0.1 * k / 8] * 10)
    for task in ("TaskA-v4", "TaskB-v4"):  # GePPO with GAE: all its seeds at K = 32, one of three at K = 8
        write_run(folder, task, "geppo-gae", 8, 1, [100] * 10)
        for seed in (1, 2, 3):
            write_run(folder, task, "geppo-gae", 32, seed, [50] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    report = open(os.path.join(folder, "report.md")).read()
    recovered = report[report.index("[start:lag_recovered]"):report.index("[end:lag_recovered]")]
    assert "at K = 8 is below 0.9 of its mean at K = 1" in recovered and "TaskC-v4" in recovered
    scan = report[report.index("[start:lag_scan_k32]"):report.index("[end:lag_scan_k32]")]
    assert "on TaskA-v4, TaskB-v4, beside K = 1 and 8" in scan and "15.5 on average" in scan
    assert "| TaskA-v4 | decoupled PPO | | 1.00 | 0.80 |" in scan.replace("|  |", "| |")
    assert "| TaskA-v4 | PPO | 1.00 | 0.60 | 0.20 |" in scan
    rows = {line.split("|")[1].strip(" *"): line for line in scan.splitlines() if line.startswith("| ")}
    assert "0.75 [" in rows["median"].split("|")[3]  # decoupled PPO: (80 - 20) / (100 - 20)
    assert "| decoupled PPO | 32 | 0.4 | | 100 | 0.50 |" in scan.replace("|  |", "| |")  # its cap bound in half the updates
    assert "| VACO | 32 |" in scan and "| PPO | 8 |" in scan
    geppo_gae = next(line for line in scan.splitlines() if line.startswith("| TaskA-v4 | GePPO with GAE |"))
    assert [cell.strip() for cell in geppo_gae.split("|")[3:-1]] == ["", "", "0.50"]  # no cell of a block running
    figure = saved[os.path.join(folder, "lag_scan_K32.png")]
    readable(figure)
    assert [ax.get_title() for ax in figure.axes if ax.get_visible()] == ["IQM over 2 tasks", "TaskA-v4", "TaskB-v4"]


def test_remedies_at_a_larger_lag_beside_decoupled_ppo(tmp_path, saved):
    # PPO at K 1 and 8 on three tasks, at K = 32 on two of them, where PPO loses 80 of 100 above random, decoupled PPO wins back a quarter of
    # that, the KL stop 3/4 on TaskA and all on TaskB; the stale-sample remedy has one seed of three: left out, named
    folder, _ = study_folder(tmp_path, {"TaskA-v4": 0.0, "TaskB-v4": 0.0, "TaskC-v4": 0.0})
    for algorithm, k, final in (("ppo", 1, 100), ("vaco", 1, 100), ("ppo", 8, 60), ("vaco", 8, 70)):  # the grid's third
        for seed in (1, 2, 3):
            write_run(folder, "TaskC-v4", algorithm, k, seed, [final] * 10)
    finals = {("ppo", 1): [100, 100], ("vaco", 1): [100, 100], ("ppo", 8): [60, 60], ("vaco", 8): [70, 70],
              ("ppo", 32): [20, 20], ("ppo-decoupled", 32): [40, 40], ("ppo-decoupled-kl-0.015", 32): [80, 100]}
    entropy = {("ppo", 1): 1.0, ("ppo", 32): 5.0, ("ppo-decoupled", 32): -2.0, ("ppo-decoupled-kl-0.015", 32): 0.5}
    for (algorithm, k), returns in finals.items():
        for task, final in zip(("TaskA-v4", "TaskB-v4"), returns):
            for seed in (1, 2, 3):
                write_run(folder, task, algorithm, k, seed, [final - 2 + seed] * 10)
                if (algorithm, k) in entropy:  # the last update's entropy is each seed's: 1 apart
                    write_csv_columns(folder, task, algorithm, seed, k=k,
                                      entropy=[9.0] * 9 + [entropy[(algorithm, k)] + seed - 2])
    write_run(folder, "TaskA-v4", "ppo-decoupled-lag-8", 32, 1, [90] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=200))
    report = open(os.path.join(folder, "report.md")).read()
    found = report[report.index("[start:remedies_k32]"):report.index("[end:remedies_k32]")]
    rows = {line.split("|")[1].strip(" *"): [c.strip(" *") for c in line.split("|")[2:-1]]
            for line in found[:found.index("How wide")].splitlines() if line.startswith("| ")}
    assert "| task | decoupled PPO (3 seeds) | decoupled PPO + KL stop (3 seeds) |" in found
    assert rows["TaskA-v4"][0].startswith("0.25 [") and rows["TaskA-v4"][1].startswith("0.75 [")
    assert rows["median"][1].startswith("0.88 [")  # (0.75 + 1) / 2
    assert rows["tasks at 0.75 or more"] == ["0 of 2", "2 of 2"]
    assert "| TaskB-v4 | 1.00 [0.00, 2.00] | 5.00 | -2.00 | 0.50 |" in found  # synchronous PPO's seeds range 0 to 2
    assert "decoupled PPO, lag under 8 (1 of 6 runs)" in found  # 3 seeds, as synchronous PPO
    assert "remedies_k8" not in report  # at the grid's K the methods under lag have their own sections
    figure = saved[os.path.join(folder, "remedies_K32.png")]
    readable(figure)
    assert [ax.get_title() for ax in figure.axes] == ["TaskA-v4: return", "TaskA-v4: entropy", "TaskB-v4: return",
                                                      "TaskB-v4: entropy"]
    assert len(figure.axes[1].get_lines()) == 4  # PPO at K = 1 and 32, decoupled PPO, the KL stop


def test_geppos_eps_beside_the_studys_on_the_seeds_it_ran():
    # GePPO at K = 8 with 3 seeds (ends 90, 100, 110 above random) and eps = 0.1 on seed 1 (ends 130 on TaskA: outside
    # eps = 0.2's range; 96 on TaskB: inside); PPO at K = 1 ends at 100: the normalised shift is (0.4 + 0.06) / 2
    from benchmark.study.sections import geppo_eps

    def run(task, algorithm, k, seed, final):
        return {"task": task, "algorithm": algorithm, "k": k, "seed": seed, "total_timesteps": 10}, \
            [{"step": i + 1, "episodes": 1, "return_mean": final} for i in range(10)]

    runs = [run(t, "ppo", k, s, 100) for t in ("TaskA-v4", "TaskB-v4") for k in (1, 8) for s in (1, 2, 3)]
    runs += [run(t, "vaco", k, s, 100) for t in ("TaskA-v4", "TaskB-v4") for k in (1, 8) for s in (1, 2, 3)]
    runs += [run(t, "geppo", 8, s, 80 + 10 * s) for t in ("TaskA-v4", "TaskB-v4") for s in (1, 2, 3)]
    plan = {(t, "geppo-clip-0.1", 8, 1) for t in ("TaskA-v4", "TaskB-v4")}
    randoms = {"TaskA-v4": 0.0, "TaskB-v4": 0.0}
    first = runs + [run("TaskA-v4", "geppo-clip-0.1", 8, 1, 130)]
    lines = geppo_eps.section(analyze.study_of(first, randoms, planned=plan))
    assert "GePPO with ε = 0.1 (1 of 2 runs)" in "\n".join(lines)  # one task still to run: no table
    lines = geppo_eps.section(analyze.study_of(first + [run("TaskB-v4", "geppo-clip-0.1", 8, 1, 96)], randoms,
                                               planned=plan))
    assert "| TaskA-v4 | 90 | 130 | [90, 110] | outside |" in lines
    assert "| TaskB-v4 | 90 | 96 | [90, 110] | inside |" in lines
    assert any("mean over the 2 tasks: +0.23 (from +0.06 to +0.40)" in line for line in lines)


def test_without_lag_loss_there_is_no_lag_recovered_section(tmp_path):
    folder, randoms = study_folder(tmp_path)
    for seed in (1, 2):
        for task, base in randoms.items():
            for algorithm in ("ppo", "vaco"):
                for k in (1, 8):
                    write_run(folder, task, algorithm, k, seed, [base + 20 + seed] * 10)
            write_run(folder, task, "ppo-decoupled", 8, seed, [base + 20 + seed] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=50))
    report = open(os.path.join(folder, "report.md")).read()
    assert "lag_recovered" not in report and "start:decoupled_diagnostics" in report


def test_the_return_at_a_step_inside_longer_runs(tmp_path):
    # runs of 30 updates of 1000 steps whose update i returns 100 i (+ seed): at 10k steps, the episodes
    # that ended in (9k, 10k] are update 10's
    folder, _ = study_folder(tmp_path)
    for seed in (1, 2, 3):
        write_run(folder, "TaskA-v4", "ppo", 8, seed, [100.0 * i + seed for i in range(1, 31)])
        write_run(folder, "TaskA-v4", "vaco", 8, seed, [200.0 * i for i in range(1, 31)])
    write_run(folder, "TaskA-v4", "ppo", 1, 1, [5.0] * 10)  # 10k steps: not longer, left out
    lines = window.section(analyze.load_study(folder, window=10_000))
    assert lines[0] == "### Inside the runs, at 10,000 steps"
    assert any("between 9,000 and 10,000 env steps" in line for line in lines)
    assert "| task | ppo K=8 | vaco K=8 |" in lines
    assert "| TaskA-v4 | 1002 [1000, 1004] | 2000 [2000, 2000] |" in lines  # 1002 ± t(0.975, 2) * 1 / sqrt(3)
    analyze.main(analyze.Args(results_dir=folder, reps=50, window=10_000))
    assert "[start:window]" in open(os.path.join(folder, "report.md")).read()


def test_lag_hurts_only_where_synchronous_ppo_beats_random_and_loses_under_lag():
    finals = {"Hurt-v4": (100.0, 20.0), "Better-v4": (-10.0, -9.5), "Level-v4": (100.0, 95.0)}  # PPO K=1, K=8
    randoms = {"Hurt-v4": 0.0, "Better-v4": 0.0, "Level-v4": 0.0}
    runs = [(dict(task=task, algorithm="ppo", k=k, seed=1, total_timesteps=10),
             [dict(step=10, episodes=1, return_mean=final)])
            for task, pair in finals.items() for k, final in zip((1, 8), pair)]
    raw, _ = scores.score_table(runs, randoms)
    # Better-v4: synchronous PPO is below random there (and lag helps it): no loss to win back
    assert scores.lag_hurt_tasks(raw, randoms, list(finals), 8) == ["Hurt-v4"]
    assert scores.lag_hurt_tasks(raw, randoms, list(finals), 1) == []  # no lag, no loss


def test_a_folder_without_synchronous_ppo_reports_returns_only(tmp_path, saved):
    folder, randoms = study_folder(tmp_path)
    for seed in (1, 2):
        write_run(folder, "TaskA-v4", "ppo", 8, seed, [10.0 * seed] * 10)
        write_run(folder, "TaskA-v4", "vaco", 8, seed, [30.0] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=50))
    report = open(os.path.join(folder, "report.md")).read()
    assert "no normalised scores: returns only" in report and "start:aggregates_final" not in report
    assert "| TaskA-v4 | 15 [-49, 79] | 30 [30, 30] | 2.00 |" in report  # 30 / 15 above a random 0
    assert [os.path.basename(p) for p in saved] == ["learning_curves.png"]


def readable(fig, legend=True):
    """What every figure of analyze.py promises: every axis labelled, no text under plotting.MIN_FONT_PT (10 px high
    on a phone), at most two panels a row, a width that a docs column shows without shrinking it much, a legend
    (unless the tick labels name what is drawn, as in the aggregates' interval plots), and no study id in it
    ("ppo-decoupled"): the pages' names."""
    import matplotlib.text

    assert fig.get_figwidth() <= plotting.FIGURE_WIDTH + 1e-9
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert panels
    for ax in panels:
        assert ax.get_xlabel(), f"{ax.get_title()!r}: no x label"
        shared = ax.get_shared_y_axes().get_siblings(ax)
        assert any(a.get_ylabel() for a in shared), f"{ax.get_title()!r}: no y label"
    fig.canvas.draw()  # the panels' places on the page, sub-figures included
    rows = collections.Counter(round(ax.get_window_extent().y0, 1) for ax in panels)
    assert max(rows.values()) <= 2, "more than two panels a row"
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text()]
    assert min(sizes) >= plotting.MIN_FONT_PT
    legends = fig.legends + [ax.get_legend() for ax in panels if ax.get_legend()]
    assert legends or not legend, "no legend"
    page = fig.bbox
    for box in [legend.get_window_extent() for legend in legends]:  # a legend wider than the figure loses its ends
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, "a legend runs past the figure's edge"
    names = [t.get_text() for legend in legends for t in legend.get_texts()]
    names += [t.get_text() for ax in panels for t in ax.get_yticklabels()]
    ids = [name for name in names if re.match(r"(ppo|vaco|spo|geppo|vtrace)-|(ppo|vaco|spo)\b", name)]
    assert not ids, f"study ids in a figure: {ids}"


def test_every_figure_is_readable_at_docs_and_phone_width(tmp_path, saved):
    from PIL import Image

    folder, randoms = study_folder(tmp_path)
    for seed in (1, 2):
        for task, base in randoms.items():
            for k in (1, 2, 4, 8):
                write_run(folder, task, "ppo", k, seed, [base + 20 - k + seed] * 10)
                write_run(folder, task, "vaco", k, seed, [base + 30 - k + seed] * 10)
            for k in (1, 8):  # a baseline at two of the four Ks: a dashed line
                write_run(folder, task, "spo", k, seed, [base + 10 + seed] * 10)
                write_run(folder, task, "vaco-behaviour-0.1", k, seed, [base + 25 + seed] * 10)
            write_run(folder, task, "vaco-proximal-0.1", 8, seed, [base + 24 + seed] * 10)
    analyze.main(analyze.Args(results_dir=folder, reps=50))
    saved = {os.path.basename(path): fig for path, fig in saved.items()}
    assert sorted(saved) == ["aggregates_K1.png", "aggregates_K8.png", "delta_sensitivity.png", "lag_recovered.png",
                             "lag_robustness.png", "learning_curves.png", "trust_region.png"]
    for name, fig in saved.items():
        readable(fig, legend=not name.startswith(("aggregates", "trust_region")))  # their tick labels name the bars
        image = Image.open(os.path.join(folder, name))
        assert image.info["dpi"][0] == pytest.approx(plotting.FIGURE_DPI, abs=0.5), name  # 2x a screen's 96 dpi
        assert image.size[0] == round(fig.get_figwidth() * plotting.FIGURE_DPI), name
        assert float(image.info["min-font-pt"]) >= plotting.MIN_FONT_PT, name  # for .ci/check_pages.py
    # SPO ran at K = 1 and 8 only: the figure says that its dashed line only joins those two
    texts = [t.get_text() for legend in saved["lag_robustness.png"].legends for t in legend.get_texts()]
    assert any("K = 1 and 8 only" in t and "dashed" in t for t in texts), texts
    lines = {line.get_label(): line.get_linestyle() for line in saved["lag_robustness.png"].axes[0].get_lines()}
    assert lines["SPO"] == "--" and lines["PPO"] == lines["VACO"] == "-"
    curves = saved["learning_curves.png"]
    assert len([ax for ax in curves.axes if ax.get_visible()]) == 2 * 4  # 2 tasks x 4 Ks, two a row
    labels = [t.get_text() for t in curves.legends[0].get_texts()]
    assert labels == ["PPO (2 seeds)", "SPO (2 seeds)", "VACO (2 seeds)", "VACO, δ = 0.1 against β (2 seeds)",
                      r"VACO, δ = 0.1 against $\pi_T$ (2 seeds)"]


def test_the_eta_takes_each_task_at_its_own_pace(tmp_path):
    folder = str(tmp_path)
    assert runner.seconds_per_step(folder) == {} and runner.expected_seconds([], {}) is None
    # 10 updates of 1000 steps each: TaskA at 0.01 and 0.03 s a step, TaskB at 0.005; a reused twin took 0 s
    write_run(folder, "TaskA-v4", "ppo", 1, 1, [0.0] * 10, seconds=100.0)
    write_run(folder, "TaskA-v4", "ppo", 1, 2, [0.0] * 10, seconds=300.0)
    write_run(folder, "TaskB-v4", "ppo", 1, 1, [0.0] * 10, seconds=50.0)
    write_run(folder, "TaskB-v4", "vaco", 1, 1, [0.0] * 10, seconds=0.0)
    rates = runner.seconds_per_step(folder)
    assert rates == pytest.approx({"TaskA-v4": 0.02, "TaskB-v4": 0.005})
    # a task not run yet goes at the mean of the others' rates, 0.0125 s a step
    todo = [presets.Run("TaskA-v4", "vaco", 8, 1, 20_000), presets.Run("TaskC-v4", "ppo", 1, 1, 10_000)]
    assert runner.expected_seconds(todo, rates) == pytest.approx(20_000 * 0.02 + 10_000 * 0.0125)


def test_under_a_time_limit_only_runs_that_can_end_in_time_are_started():
    reacher, ant = (presets.Run(task, "ppo", 1, 2, 1_000_000) for task in ("Reacher-v4", "Ant-v4"))
    slowest = {"Reacher-v4": 0.0005, "Hopper-v4": 0.001}  # seconds a step: 500 s and 1000 s a run
    assert runner.next_that_fits([ant, reacher], slowest, None) == ant  # no limit: the order
    assert runner.next_that_fits([ant, reacher], slowest, 900.0) == reacher  # Ant, not timed yet, at Hopper's pace
    assert runner.next_that_fits([ant, reacher], slowest, 1000.0) == ant
    assert runner.next_that_fits([ant, reacher], slowest, 499.0) is None
    assert runner.next_that_fits([ant, reacher], {}, 1.0) == ant  # nothing timed: the order, while time is left
    assert runner.next_that_fits([ant, reacher], {}, 0.0) is None
    assert [runner.parse_duration(t) for t in ("2h45m", "90m", "30s", "1h")] == [9900, 5400, 30, 3600]


def test_a_study_with_a_time_limit_starts_what_fits_and_leaves_the_rest(tmp_path, monkeypatch, capsys):
    folder, steps = str(tmp_path), 1000
    # timed seed-1 runs: Ant takes 5 s, Reacher 0.5 s
    write_run(folder, "Ant-v4", "ppo", 1, 1, [0.0], steps_per_update=steps, seconds=5.0)
    write_run(folder, "Reacher-v4", "ppo", 1, 1, [0.0], steps_per_update=steps, seconds=0.5)
    started = []

    def execute(run, out_dir):  # Reacher's next run is slower than its first: 1.6 s
        started.append(run.name)
        time.sleep(1.6)
        write_run(out_dir, run.task, run.algorithm, run.k, run.seed, [0.0], steps_per_update=steps, seconds=1.6)

    monkeypatch.setattr(runner, "execute", execute)
    runner.main(runner.Args(preset="ten-tasks", algorithms=["ppo"], tasks=["Ant-v4", "Reacher-v4"], ks=[1],
                          total_timesteps=steps, out_dir=folder, jobs=1, time_limit="3s"))
    # Ant (5 s) never fits in 3 s; Reacher's seed 2 does (0.5 s), then seed 3 (now 1.6 s) no longer does
    assert started == ["Reacher-v4__ppo__K1__s2"]
    out = capsys.readouterr().out
    assert "to go, 1 at a time" in out and "| time limit 3s" in out
    assert "time limit: 3 run(s) left for the next sitting" in out


def test_learning_curves_bridge_the_slices_where_no_episode_ended(tmp_path, saved):
    folder, _ = study_folder(tmp_path)
    ended = [i % 5 != 2 for i in range(50)]  # 50 updates, one per slice; no episode ends in every 5th
    for seed in (1, 2):
        write_run(folder, "TaskA-v4", "ppo", 1, seed, [10.0 * i + seed for i in range(50)],
                  episodes=[int(e) for e in ended])
    path = str(tmp_path / "curves.png")
    plotting.curves_figure(scores.load_runs(folder), {"ppo K=1": ["TaskA-v4"]}, [1], (), path)
    (line,) = saved[path].axes[0].get_lines()
    kept = np.flatnonzero(ended)
    np.testing.assert_allclose(line.get_xdata(), (kept + 1) * 1000 / 1e6)  # one line through the others
    np.testing.assert_allclose(line.get_ydata(), 10.0 * kept + 1.5)


def test_baselines_are_compared_on_the_tasks_they_ran(tmp_path):
    folder, randoms = study_folder(tmp_path)
    for seed in (1, 2):
        for task, base in randoms.items():
            for k in (1, 8):
                write_run(folder, task, "ppo", k, seed, [base + 20] * 10)
                write_run(folder, task, "vaco", k, seed, [base + 30] * 10)
        write_run(folder, "TaskA-v4", "spo", 1, seed, [10.0] * 10)  # SPO on one task only: half of PPO
        write_run(folder, "TaskA-v4", "spo", 8, seed, [40.0] * 10)  # twice PPO
    study = analyze.load_study(folder, reps=100)
    assert baselines.baseline_tasks(study.raw, [1, 8]) == (["ppo", "spo", "vaco"], [1, 8], ["TaskA-v4"])
    report = "\n".join(baselines.section(study))
    assert "Tasks: TaskA-v4." in report
    assert "| spo | 1 | 2 | 0.50 [0.50, 0.50]" in report and "| spo | 8 | 2 | 2.00 [2.00, 2.00]" in report
    assert "| spo | 1 | 1.00 [1.00, 1.00] |" in report and "| spo | 8 | 0.00 [0.00, 0.00] |" in report  # P(VACO > SPO)
    # the main sections cover TaskB too, which SPO did not run: the section above is needed ...
    assert study.main_tasks == ["TaskA-v4", "TaskB-v4"]
    # ... but not once SPO ran every main task: the main sections hold it, and this one says so in a line instead
    assert baselines.section(dataclasses.replace(study, main_tasks=["TaskA-v4"])) == \
        "the baselines ran on every main task: the aggregates above hold them"


# --- the runner ---------------------------------------------------------------------------------

def test_shards_split_the_grid_without_overlap():
    runs = presets.grid("cpu")
    shards = [runner.select(runs, shard=f"{i}/7") for i in range(1, 8)]
    assert sorted(sum(shards, []), key=runs.index) == runs
    assert len(runs) == len(set(runs))
    assert all(r.steps == 300_000 for r in runs)


def test_select_filters_by_every_axis():
    runs = presets.grid("cpu-1m")
    picked = runner.select(runs, algorithms=["ppo"], tasks=["Ant-v4"], ks=[8], seeds=[1, 2])
    assert [(r.algorithm, r.task, r.k, r.seed) for r in picked] == [("ppo", "Ant-v4", 8, 1), ("ppo", "Ant-v4", 8, 2)]


def test_ten_tasks_preset_is_ppo_and_vaco_at_k_1_and_8_then_decoupled_ppo_at_k_8():
    runs = presets.grid("ten-tasks")
    assert len(runs) == 150
    assert {r.task for r in runs} == set(presets.PAPER_TASKS) and len(presets.PAPER_TASKS) == 10
    main, decoupled = runs[:120], runs[120:]
    assert {(r.algorithm, r.k, r.seed) for r in main} == set(itertools.product(["ppo", "vaco"], [1, 8], [1, 2, 3]))
    assert {(r.algorithm, r.k, r.seed) for r in decoupled} == {("ppo-decoupled", 8, s) for s in [1, 2, 3]}
    assert {r.steps for r in runs} == {1_000_000}
    proximal = presets.grid("ten-tasks-proximal")  # beside them, in the same folder: VACO's filter against pi_T
    assert {(r.task, r.seed, r.steps) for r in proximal} == {(r.task, r.seed, r.steps) for r in decoupled}
    assert {(r.algorithm, r.k) for r in proximal} == {("vaco-proximal-0.1", 8)}
    assert presets.METHODS["ppo-decoupled"].spellings() == [("decoupled_ppo_continuous.py", ()),
                                                            ("ppo_continuous.py", ("--clip-reference", "proximal"))]
    assert {r.task for r in runs[:40]} == set(presets.PAPER_TASKS)


def test_every_paper_task_makes_and_steps():
    import gymnasium as gym

    for task in presets.PAPER_TASKS:
        env = gym.make(task)
        env.reset(seed=0)
        env.step(env.action_space.sample())
        env.close()


def test_paper_preset_covers_every_algorithm_lag_and_task():
    runs = presets.grid("paper")
    cells = [(r.algorithm, r.k, r.task, r.seed) for r in runs]
    assert len(cells) == len(set(cells))  # no run twice
    assert set(cells) == set(itertools.product(["ppo", "vaco"] + presets.BASELINES, [1, 2, 4, 8], presets.PAPER_TASKS,
                                               range(1, 11)))


@pytest.mark.parametrize("algorithm", sorted(presets.METHODS))
def test_every_algorithm_is_a_valid_command_of_its_script(algorithm, tmp_path):
    # parsed by the script's own parser, a retired method's by its script as of its commit: a misspelt or retired flag
    # fails here, not hours into a study
    method = presets.METHODS[algorithm]
    if method.retired_at:
        path = script_at(method.retired_at, method.script, tmp_path) or pytest.skip("git or that commit not at hand")
        module = import_script(path, f"{method.script[: -len('.py')]}_at_{method.retired_at}")
    else:
        module = importlib.import_module(method.script[: -len(".py")])
    args = tyro.cli(module.Args, args=list(method.flags))
    expected = {  # what the ablations switch off, and nothing else
        "vaco": dict(advantage_alignment=True, tv_filter=True, clip_vloss=False, tv_threshold=0.1),
        "vaco-noalign": dict(advantage_alignment=False, tv_filter=True, clip_vloss=False),
        "vaco-nofilter": dict(advantage_alignment=True, tv_filter=False, clip_vloss=False),
        "vaco-none": dict(advantage_alignment=False, tv_filter=False, clip_vloss=False),
        "ppo": dict(kl_coef=0.0, clip_vloss=True),
        "ppo-kl": dict(kl_coef=0.1, clip_vloss=True),
        "spo": dict(epsilon=0.2),
    }.get(algorithm, {})
    assert {key: getattr(args, key) for key in expected} == expected


def test_finished_runs_are_skipped_and_changed_ones_kept_aside(tmp_path):
    folder = str(tmp_path)
    run = write_run(folder, "Hopper-v4", "vaco", 8, 1, [1.0] * 3)
    assert runner.is_finished(run, folder)
    changed = presets.Run(run.task, run.algorithm, run.k, run.seed, run.steps + 1)  # another command
    assert not runner.is_finished(changed, folder)
    move_stale(changed.name, folder)
    assert sorted(os.listdir(os.path.join(folder, "stale"))) == [run.name + ".csv", run.name + ".json"]
    assert not runner.is_finished(run, folder)


def test_a_run_that_trains_like_a_finished_one_reuses_its_results(tmp_path):
    # "vaco" spells out the flags of one of the delta-sweep variants: the same training, another name
    training = {a: (m.script, m.flags) for a, m in presets.METHODS.items()}
    (twin,) = [a for a in training if a != "vaco" and training[a] == training["vaco"]]
    trained_by = dict(commit="a" * 40, modified=[])
    finished = write_run(str(tmp_path), "Hopper-v4", twin, 8, 2, [1.0, 2.0, 3.0], code=trained_by)
    run = presets.Run("Hopper-v4", "vaco", 8, 2, finished.steps)
    assert runner.execute(run, str(tmp_path)) == 0.0  # nothing trained
    assert runner.is_finished(run, str(tmp_path))
    assert (tmp_path / f"{run.name}.csv").read_text() == (tmp_path / f"{finished.name}.csv").read_text()
    meta = json.loads((tmp_path / f"{run.name}.json").read_text())
    assert meta["same_training_as"] == finished.name and meta["code"] == trained_by  # the twin's code, not today's
    other_seed = presets.Run("Hopper-v4", "vaco", 8, 3, finished.steps)
    assert runner.find_twin(other_seed, str(tmp_path)) is None


def test_a_run_recorded_in_an_earlier_spelling_of_its_method_is_finished(tmp_path, monkeypatch, capsys):
    # decoupled PPO was ppo_continuous.py --clip-reference proximal before it had a script of its own: a run recorded
    # so is the same training, neither set aside as stale nor trained again
    folder = str(tmp_path)
    old = ("python ppo_continuous.py --env-id Ant-v4 --policy-buffer 8 --seed 4 --total-timesteps 2000 "
           "--exp-name ppo-decoupled --clip-reference proximal")
    run = write_run(folder, "Ant-v4", "ppo-decoupled", 8, 4, [1.0, 2.0])
    (tmp_path / f"{run.name}.json").write_text(json.dumps({**json.loads((tmp_path / f"{run.name}.json").read_text()),
                                                           "command": old}))
    assert run.portable_commands() == ["python decoupled_ppo_continuous.py --env-id Ant-v4 --policy-buffer 8 --seed 4 "
                                       "--total-timesteps 2000 --exp-name ppo-decoupled", old]
    files = {name: (tmp_path / name).read_text() for name in os.listdir(folder)}
    assert runner.is_finished(run, folder) and runner.execute(run, folder) == 0.0
    monkeypatch.setattr(runner, "execute", lambda run, out_dir: pytest.fail(f"{run.name} trained again"))
    runner.main(runner.Args(preset="ten-tasks-ten-seeds", algorithms=["ppo-decoupled"], tasks=["Ant-v4"], ks=[8],
                            seeds=[4], total_timesteps=run.steps, out_dir=folder))
    assert "1 runs, 1 already finished, 0 to go" in capsys.readouterr().out
    assert {name: (tmp_path / name).read_text() for name in os.listdir(folder)} == files  # no stale/, none rewritten
    # a run of another name recorded in the earlier spelling trains as decoupled PPO's seed 5: its twin, reused
    twin = "Ant-v4__clip-proximal__K8__s5"
    for ext, text in ((".csv", files[f"{run.name}.csv"]),
                      (".json", json.dumps(dict(command=old.replace("--seed 4", "--seed 5").replace(
                          "--exp-name ppo-decoupled", "--exp-name clip-proximal"), code=None)))):
        (tmp_path / f"{twin}{ext}").write_text(text)
    seed_5 = presets.Run("Ant-v4", "ppo-decoupled", 8, 5, run.steps)
    assert runner.find_twin(seed_5, folder) == os.path.join(folder, twin)
    monkeypatch.undo()  # the runner's own execute
    assert runner.execute(seed_5, folder) == 0.0
    meta = json.loads((tmp_path / f"{seed_5.name}.json").read_text())
    assert meta["same_training_as"] == twin and meta["command"] == seed_5.portable_command()
    assert (tmp_path / f"{seed_5.name}.csv").read_text() == files[f"{run.name}.csv"]


def test_a_retired_method_trains_with_its_script_as_of_its_commit(tmp_path, monkeypatch):
    # the KL stop's flag is gone from today's scripts: the runner writes ppo_continuous.py as of the last commit that
    # had it into the run's scratch folder and trains that, and the run's JSON records the command its finished runs
    # hold. Training is stood in for: what it ran is recorded, and it logs one update.
    from torch.utils.tensorboard import SummaryWriter

    run = presets.Run("Hopper-v4", "ppo-decoupled-kl-0.015", 32, 1, 2048)
    shown = subprocess.run(["git", "show", f"{presets.RETIRED_AT}:ppo_continuous.py"], cwd=runner.ROOT,
                           capture_output=True, text=True)
    if shown.returncode:
        pytest.skip("git, or the retired methods' commit, is not at hand")
    trained, real_run = [], subprocess.run

    def training(command, **kwargs):
        if command[0] == "git":  # the runner's record of its code, and the retired script's
            return real_run(command, **kwargs)
        with open(command[1]) as f:
            trained.append((command, f.read(), kwargs["cwd"]))
        writer = SummaryWriter(os.path.join(kwargs["cwd"], "runs", "stand-in"))
        writer.add_scalar("charts/episodic_return", 5.0, 1000)
        writer.add_scalar("charts/SPS", 100.0, 2048)
        writer.close()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", training)
    runner.execute(run, str(tmp_path))
    ((command, script, scratch),) = trained
    assert command[1] == os.path.join(scratch, "ppo_continuous.py") and script == shown.stdout
    assert command[2:] == ["--env-id", "Hopper-v4", "--policy-buffer", "32", "--seed", "1", "--total-timesteps", "2048",
                           "--exp-name", "ppo-decoupled-kl-0.015", "--clip-reference", "proximal", "--max-update-kl",
                           "0.015"]
    meta = json.loads((tmp_path / f"{run.name}.json").read_text())
    assert meta["command"] == ("python ppo_continuous.py --env-id Hopper-v4 --policy-buffer 32 --seed 1 "
                               "--total-timesteps 2048 --exp-name ppo-decoupled-kl-0.015 --clip-reference proximal "
                               "--max-update-kl 0.015")
    assert meta["script_as_of"] == presets.RETIRED_AT and runner.is_finished(run, str(tmp_path))
    assert (tmp_path / f"{run.name}.csv").read_text().splitlines()[1].startswith("2048,1,5,")
    # a method of today's scripts trains with the script at the repository root
    today = presets.Run("Hopper-v4", "ppo", 32, 1, 2048)
    runner.execute(today, str(tmp_path))
    assert trained[-1][0][1] == os.path.join(runner.ROOT, "ppo_continuous.py")
    assert "script_as_of" not in json.loads((tmp_path / f"{today.name}.json").read_text())


def test_the_list_fetches_a_retired_methods_script_first(capsys):
    runner.main(runner.Args(preset="ten-tasks-k32-screen", algorithms=["ppo-decoupled-lag-8"], tasks=["Ant-v4"],
                            list=True))
    fetch, train = capsys.readouterr().out.strip().split(" && python ")
    assert fetch == (f'folder=$(mktemp -d) && git show {presets.RETIRED_AT}:ppo_continuous.py > '
                     '"$folder/ppo_continuous.py"')
    assert train == ('"$folder/ppo_continuous.py" --env-id Ant-v4 --policy-buffer 32 --seed 1 --total-timesteps 1000000 '
                     '--exp-name ppo-decoupled-lag-8 --clip-reference proximal --max-policy-lag 8')
    # run by a shell at the repository root, its first part writes that commit's script, which has the option
    shown = subprocess.run(["sh", "-c", f'{fetch} && cat "$folder/ppo_continuous.py" && rm -r "$folder"'],
                           cwd=runner.ROOT, capture_output=True, text=True)
    if shown.returncode:
        pytest.skip("git, or the retired methods' commit, is not at hand")
    assert "max_policy_lag" in shown.stdout
    runner.main(runner.Args(preset="ten-tasks-k32", algorithms=["ppo-decoupled"], tasks=["Ant-v4"], list=True))
    assert capsys.readouterr().out.splitlines() == [
        f"python decoupled_ppo_continuous.py --env-id Ant-v4 --policy-buffer 32 --seed {seed} --total-timesteps 1000000 "
        "--exp-name ppo-decoupled" for seed in (1, 2, 3)]


def test_same_runs_runs_a_method_as_the_reference_commit_spells_it(tmp_path):
    from benchmark.study import same_runs

    # the retired methods' commit is before decoupled_ppo_continuous.py: decoupled PPO is a flag of PPO's script there
    found = same_runs.reference_spellings(["ppo-decoupled", "ppo"], presets.RETIRED_AT, str(tmp_path))
    if not found:
        pytest.skip("git, or the retired methods' commit, is not at hand")
    script = os.path.join(str(tmp_path), "ppo_continuous.py")
    assert found == {"ppo-decoupled": (script, ("--clip-reference", "proximal")), "ppo": (script, ())}
    assert sorted(os.listdir(tmp_path)) == ["ppo_continuous.py"]
    with pytest.raises(SystemExit, match="ppo-decoupled-lag-8: retired, trained by the scripts as of 56b86c9"):
        same_runs.main(same_runs.Args(reference=presets.RETIRED_AT, algorithms=["ppo", "ppo-decoupled-lag-8"]))


def test_every_method_has_one_record_and_an_algorithm_without_one_is_an_error():
    import matplotlib.markers

    for grouped in (presets.MAIN_ALGORITHMS, presets.LAG_METHODS, presets.REMEDIES, presets.SWEEP):
        assert set(grouped) <= set(presets.METHODS)
    assert all(presets.METHODS[a].parts for a in ["ppo", *presets.LAG_METHODS])  # the trust-region section's columns
    for method in presets.METHODS.values():
        assert method.colour in plotting.OKABE_ITO and method.marker in matplotlib.markers.MarkerStyle.markers
    assert (plotting.colour("geppo-gae"), plotting.marker("geppo-gae")) == (plotting.OKABE_ITO["black"], "X")
    # VACO against pi_T is a method under lag of its own, and a variant of the delta sweep beside the others
    assert plotting.name("vaco-proximal-0.1") == r"VACO against $\pi_T$"
    assert plotting.name("vaco-proximal-0.1", presets.SWEEP) == r"VACO, δ = 0.1 against $\pi_T$"
    assert plotting.colour("vaco-proximal-0.1", ["vaco-behaviour-0.1", "vaco-proximal-0.1"]) == plotting.OKABE_ITO["sky"]
    for use in (plotting.colour, plotting.marker, plotting.name, lambda a: presets.Run("Ant-v4", a, 1, 1, 10).command(),
                lambda a: incomplete_line({a: (1, 3)}, 8)):
        with pytest.raises(LookupError) as error:
            use("ppo-clipped")
        assert str(error.value) == ("no record of the method 'ppo-clipped' in benchmark/study/presets.py's METHODS "
                                    "(CONTRIBUTING.md, 'Add a question to the study')")


def test_a_run_finished_meanwhile_by_another_process_is_not_trained_again(tmp_path, monkeypatch):
    finished = write_run(str(tmp_path), "Hopper-v4", "ppo", 1, 1, [1.0, 2.0])
    before = (tmp_path / f"{finished.name}.json").read_text()
    # the study lists the run as still to do (another process finishes it after the listing) ...
    calls, real_is_finished = [], runner.is_finished

    def listed_as_to_do(run, out_dir):
        calls.append(run)
        return len(calls) > 1 and real_is_finished(run, out_dir)

    monkeypatch.setattr(runner, "is_finished", listed_as_to_do)
    runner.main(runner.Args(preset="cpu", algorithms=["ppo"], tasks=["Hopper-v4"], ks=[1], seeds=[1],
                          total_timesteps=finished.steps, out_dir=str(tmp_path), jobs=1))
    # ... and finds it finished when its turn comes: nothing trained, rewritten or set aside as stale
    assert len(calls) == 2 and (tmp_path / f"{finished.name}.json").read_text() == before
    assert not (tmp_path / "stale").exists()


def test_study_vaco_is_the_scripts_default():
    # the study's "vaco" is what a user gets without flags, in both scripts that carry the method
    sys.path.insert(0, runner.ROOT)
    import vaco_async
    import vaco_continuous

    flags = presets.METHODS["vaco"].flags
    for module in (vaco_continuous, vaco_async):
        assert float(flags[flags.index("--tv-threshold") + 1]) == module.Args.tv_threshold
        assert flags[flags.index("--tv-reference") + 1] == module.Args.tv_reference


def test_a_tiny_study_runs_then_resumes_without_rerunning(tmp_path, capsys):
    args = runner.Args(preset="cpu", algorithms=["vaco-proximal-0.1"], tasks=["Hopper-v4"], ks=[8],
                      shard="1/3", total_timesteps=4096, out_dir=str(tmp_path), jobs=1)
    runner.main(args)
    (csv_name,) = [n for n in os.listdir(tmp_path) if n.endswith(".csv")]
    rows = open(tmp_path / csv_name).read().splitlines()
    assert rows[0].startswith("step,episodes,return_mean,policy_lag_mean,backward_tv")
    assert [r.split(",")[0] for r in rows[1:]] == ["2048", "4096"]  # one row per update
    assert float(rows[1].split(",")[runner.COLUMNS.index("filter_tv")]) > 0
    assert float(rows[2].split(",")[runner.COLUMNS.index("backward_ratio_max")]) > 1  # a stale snapshot acted
    meta = json.load(open(tmp_path / csv_name.replace(".csv", ".json")))
    assert meta["command"].startswith("python vaco_continuous.py --env-id Hopper-v4 --policy-buffer 8 --seed 1")
    assert meta["code"] == runner.code_version()
    assert meta["machine"] == runner.machine() and meta["machine"]["cores"] >= 1 and meta["machine"]["cpu"]
    capsys.readouterr()
    runner.main(args)
    assert "1 already finished, 0 to go" in capsys.readouterr().out


def test_a_run_records_the_commit_and_the_python_files_that_differ_from_it(tmp_path, monkeypatch):
    def git(*words):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *words], cwd=tmp_path, check=True,
                       capture_output=True)

    monkeypatch.setattr(runner, "ROOT", str(tmp_path))
    assert runner.code_version() is None  # not a git repository
    git("init", "-q")
    (tmp_path / "script.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("a\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "notes.md").write_text("b\n")  # not code
    (tmp_path / "scratch.py").write_text("")  # untracked: trains nothing
    assert runner.code_version() == dict(commit=commit, modified=[])
    (tmp_path / "script.py").write_text("x = 2\n")
    assert runner.code_version() == dict(commit=commit, modified=["script.py"])


@pytest.mark.parametrize("overrides, message", [(dict(preset="gpu"), "unknown preset 'gpu'"),
                                                (dict(algorithms=["vac"]), "unknown algorithm(s) vac"),
                                                (dict(shard="3"), "--shard must look like I/N"),
                                                (dict(shard="4/3"), "need 1 <= I <= N"),
                                                (dict(time_limit="3 hours"), "--time-limit must look like 2h45m"),
                                                (dict(time_limit=""), "--time-limit must look like 2h45m"),
                                                (dict(time_limit="0m"), "--time-limit must be more than 0")])
def test_study_bad_input(overrides, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        runner.main(runner.Args(**overrides))


# --- benchmark/study/script_curves.py: one script's learning curves, for its page ---------------------

def test_script_curves_draw_the_script_at_its_defaults(tmp_path, saved):
    from benchmark.study import script_curves
    from PIL import Image

    folder = str(tmp_path / "study")
    os.makedirs(folder)
    # 50 updates of 1000 steps, one episode each: the figure's 50 slices hold one update each, so a
    # seed's curve is its list of returns and the plotted line is their mean over seeds
    returns = {seed: [10.0 * seed + i for i in range(50)] for seed in (1, 2, 3)}
    for seed, r in returns.items():
        for k in (1, 8):
            write_run(folder, "TaskA-v4", "vaco-behaviour-0.1", k, seed, r)  # VACO's defaults, spelt out
            write_run(folder, "TaskB-v4", "vaco", k, seed, [x + 100 for x in r])  # the same flags, another name
            write_run(folder, "TaskA-v4", "ppo", k, seed, [0.0] * 50)
            write_run(folder, "TaskB-v4", "ppo", k, seed, [5.0] * 50)
        write_run(folder, "TaskA-v4", "vaco", 1, seed, r)  # trains as vaco-behaviour-0.1 does: counted once
        write_run(folder, "TaskA-v4", "vaco-behaviour-0.2", 1, seed, [1e4] * 50)  # another delta: not drawn
        write_run(folder, "TaskA-v4", "vaco-noalign", 8, seed, [1e4] * 50)  # an ablation: not drawn
        write_run(folder, "TaskA-v4", "ppo-kl", 1, seed, [1e4] * 50)  # PPO with a flag: not the reference
        write_run(folder, "TaskA-v4", "vaco", 4, seed, [1e4] * 50)  # a K that is not drawn
    out = str(tmp_path / "img" / "vaco_continuous.png")
    script_curves.main(script_curves.Args(script="vaco_continuous.py", results_dir=folder,
                                          reference="ppo_continuous.py", out=out))
    fig = saved[out]
    readable(fig)  # labelled axes, text >= 9 pt, two panels a row, a legend
    image = Image.open(out)
    assert image.info["dpi"][0] == pytest.approx(plotting.FIGURE_DPI, abs=0.5)
    assert image.size[0] == round(plotting.FIGURE_WIDTH * plotting.FIGURE_DPI)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [block.get_suptitle() for block in fig.subfigs] == ["TaskA-v4", "TaskB-v4"]  # one block per task
    assert [ax.get_title() for ax in panels] == ["K = 1", "K = 8"] * 2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["PPO (3 seeds)", "VACO (3 seeds)"]
    mean = np.mean([returns[s] for s in returns], axis=0)
    std = np.std([returns[s] for s in returns], axis=0)  # 8.16 for every slice
    for ax, offset, ppo in zip(panels, (0, 0, 100, 100), (0.0, 0.0, 5.0, 5.0)):
        lines = {line.get_color(): line for line in ax.get_lines()}
        assert set(lines) == {plotting.colour("ppo"), plotting.colour("vaco")}
        vaco = lines[plotting.colour("vaco")]
        np.testing.assert_allclose(vaco.get_ydata(), mean + offset)  # the mean over the three seeds
        np.testing.assert_allclose(vaco.get_xdata(), np.arange(1, 51) * 1000 / 1e6)  # env steps, millions
        np.testing.assert_allclose(lines[plotting.colour("ppo")].get_ydata(), ppo)
        band = ax.collections[1].get_paths()[0].vertices[:, 1]  # vaco's band: mean - std to mean + std
        assert band.min() == pytest.approx(mean[0] + offset - std[0])
        assert band.max() == pytest.approx(mean[-1] + offset + std[-1])
    # the runs drawn, read from their commands: both study names of VACO's defaults, nothing else
    runs = [run for run in scores.load_runs(folder) if run[0]["k"] in (1, 8)]
    chosen, names = script_curves.runs_at_defaults(runs, "vaco_continuous.py")
    assert names == {"vaco-behaviour-0.1": {"TaskA-v4"}, "vaco": {"TaskB-v4"}}
    assert len(chosen) == 2 * 2 * 3 and {meta["algorithm"] for meta, _ in chosen} == {"vaco"}
    chosen, names = script_curves.runs_at_defaults(runs, "ppo_continuous.py")
    assert names == {"ppo": {"TaskA-v4", "TaskB-v4"}}
    with pytest.raises(SystemExit, match="no finished run of spo_continuous.py at its defaults"):
        script_curves.main(script_curves.Args(script="spo_continuous.py", results_dir=folder, out=out))


def test_script_curves_read_a_run_recorded_in_an_earlier_spelling(tmp_path, saved):
    # GePPO's first runs switched its learning-rate rule on with --adapt-lr, a flag the script has since dropped, and
    # decoupled PPO ran as a flag of ppo_continuous.py: both are still the script's runs at its defaults
    from benchmark.study import script_curves

    folder = str(tmp_path)
    for seed, earlier in ((1, True), (2, False)):
        for algorithm in ("geppo", "ppo-decoupled"):
            run = write_run(folder, "TaskA-v4", algorithm, 8, seed, [float(seed)] * 50)
            if earlier:
                path = os.path.join(folder, run.name + ".json")
                with open(path) as f:
                    meta = json.load(f)
                meta["command"] = run.portable_commands()[1]
                with open(path, "w") as f:
                    json.dump(meta, f)
    runs = scores.load_runs(folder)
    assert {"--adapt-lr" in meta["command"] for meta, _ in runs if meta["algorithm"] == "geppo"} == {True, False}
    for script, name in (("geppo_continuous.py", "geppo"), ("decoupled_ppo_continuous.py", "ppo-decoupled")):
        chosen, names = script_curves.runs_at_defaults(runs, script)
        assert names == {name: {"TaskA-v4"}} and sorted(meta["seed"] for meta, _ in chosen) == [1, 2]
    chosen, _ = script_curves.runs_at_defaults(runs, "ppo_continuous.py")  # the earlier spelling is not PPO's
    assert chosen == []


# --- random-policy scores -----------------------------------------------------------------------

def test_random_scores_meet_their_precision_against_ppo_and_are_measured_once(tmp_path, capsys):
    from benchmark.study import random_scores

    folder = str(tmp_path)
    write_run(folder, "Reacher-v4", "ppo", 1, 1, [-5.0] * 10)  # PPO's final return: -5
    write_run(folder, "Reacher-v4", "vaco", 1, 1, [-6.0] * 10)
    random_scores.main(random_scores.Args(folder))
    entry = random_scores.load_random_scores(folder)["Reacher-v4"]
    assert entry["reference"] == -5.0 and entry["episodes"] > 20
    assert entry["stderr"] <= 0.01 * abs(-5.0 - entry["mean"])
    # the fewest episodes that meet it: one episode fewer does not
    returns = list(itertools.islice(random_scores.random_episode_returns("Reacher-v4"), entry["episodes"]))
    assert np.mean(returns) == pytest.approx(entry["mean"])
    shorter = returns[:-1]
    assert np.std(shorter, ddof=1) / np.sqrt(len(shorter)) > 0.01 * abs(-5.0 - np.mean(shorter))
    capsys.readouterr()
    random_scores.main(random_scores.Args(folder))  # already precise enough: nothing measured again
    assert capsys.readouterr().out == ""
    # a task without a PPO K = 1 run gets the minimum, and a bare number (20 episodes) still loads
    assert random_scores.measure_random("Reacher-v4", None)["episodes"] == 20
    with open(os.path.join(folder, "random_scores.json"), "w") as f:
        json.dump({"Reacher-v4": -43.0}, f)
    assert random_scores.load_random_scores(folder)["Reacher-v4"]["mean"] == -43.0


def imported_names(source):
    """The dotted names a source imports anywhere, even inside a function (`from benchmark.study import analyze`:
    benchmark.study and benchmark.study.analyze)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def benchmark_imports(sources):
    """{module: {modules of `sources` it imports}} of {dotted module name: source}."""
    return {module: {name for name in imported_names(source) if name in sources} - {module}
            for module, source in sources.items()}


def import_cycle(graph):
    """A list of modules that import each other in a circle, or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        cycle = next(filter(None, map(visit, sorted(graph[module]))), None)
        path.pop()
        done.add(module)
        return cycle

    return next(filter(None, map(visit, sorted(graph))), None)


def benchmark_sources():
    """{dotted module name: source} of every Python file under benchmark/."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = {}
    for folder, _, names in os.walk(os.path.join(root, "benchmark")):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    sources[os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")] = f.read()
    return sources



def test_standing_still_is_the_zero_action_on_the_random_policys_episodes(tmp_path):
    """standing_still.py plays the zero action on the episodes random_scores.py plays (episode i reset with seed i),
    and its report holds the mean with its Student-t interval over the episodes."""
    from benchmark.common import t_interval
    from benchmark.study import random_scores, standing_still

    out = str(tmp_path / "standing_still.md")
    standing_still.main(standing_still.Args(tasks=["Reacher-v4"], episodes=3, out=out))
    returns = list(itertools.islice(random_scores.random_episode_returns("Reacher-v4", action=np.zeros(2)), 3))
    mean, (low, high) = t_interval(returns)
    assert f"| Reacher-v4 | {mean:.0f} [{low:.0f}, {high:.0f}] |" in open(out).read()
    assert returns != list(itertools.islice(random_scores.random_episode_returns("Reacher-v4"), 3))  # not random
    with pytest.raises(SystemExit):
        standing_still.main(standing_still.Args(tasks=["Reacher-v4"], episodes=1, out=out))

def test_each_folder_of_benchmark_imports_its_own_modules_and_the_common_one_only():
    sources = benchmark_sources()
    graph = benchmark_imports(sources)
    assert "benchmark.study.random_scores" in graph["benchmark.study.analyze"]
    assert import_cycle(graph) is None, " -> ".join(import_cycle(graph))
    for module, imported in graph.items():
        folder = module.split(".")[1]
        assert all(name == "benchmark.common" or name.split(".")[1] == folder for name in imported), (module, imported)
    for module, source in sources.items():  # the tests import benchmark code; benchmark never imports the tests
        assert not {name.split(".")[0] for name in imported_names(source)} & {"tests", "conftest"}, module
    # the check itself finds a circle, even one through an import inside a function
    circle = {"a": "import b\n", "b": "def f():\n    from c import x\n", "c": "import a\n"}
    assert import_cycle(benchmark_imports(circle)) == ["a", "b", "c", "a"]


def test_random_scores_bad_input(tmp_path):
    from benchmark.study import random_scores

    with pytest.raises(SystemExit, match="not a folder"):
        random_scores.main(random_scores.Args(str(tmp_path / "missing")))
    with pytest.raises(SystemExit, match="no finished runs"):
        random_scores.main(random_scores.Args(str(tmp_path)))
    with pytest.raises(SystemExit, match="precision"):
        random_scores.main(random_scores.Args(str(tmp_path), precision=0.0))


def test_a_remedy_at_the_grids_lag_and_without_lag():
    # Three tasks, 0 = random: PPO ends at 99-101 without lag and 59-61 at K = 8, decoupled PPO at 89-91. The KL stop's
    # seed 1 ends at 120 on TaskA (ahead of both PPOs), 100 on TaskB (beats one of synchronous PPO's three seeds: not
    # clearly behind), 50 on TaskC (behind both); without lag at 120 on TaskA and 75 on TaskB. Three seeds are planned;
    # seed 2 is in on TaskA only, where it ends at 0: no table holds it until every task has it.
    from benchmark.study.sections import remedy_grid

    def run(task, algorithm, k, seed, final):
        return {"task": task, "algorithm": algorithm, "k": k, "seed": seed, "total_timesteps": 10}, \
            [{"step": i + 1, "episodes": 1, "return_mean": final} for i in range(10)]

    tasks, kl = ("TaskA-v4", "TaskB-v4", "TaskC-v4"), "ppo-decoupled-kl-0.015"
    runs = [run(t, a, 1, s, 98 + s) for t in tasks for a in ("ppo", "vaco") for s in (1, 2, 3)]
    runs += [run(t, a, 8, s, final - 2 + s) for t in tasks for a, final in (("ppo", 60), ("vaco", 60),
                                                                            ("ppo-decoupled", 90)) for s in (1, 2, 3)]
    plan = {(t, kl, 8, s) for t in tasks for s in (1, 2, 3)} | {(t, kl, 1, s) for t in tasks[:2] for s in (1, 2, 3)}
    randoms = {t: 0.0 for t in tasks}
    assert remedy_grid.section(analyze.study_of(runs, randoms, planned=plan)) == "no run of a remedy at a lag of the grid"
    seed_1 = [run(t, kl, 8, 1, final) for t, final in zip(tasks, (120, 100, 50))]
    seed_1 += [run(t, kl, 1, 1, final) for t, final in zip(tasks[:2], (120, 75))]
    lines = remedy_grid.section(analyze.study_of(runs + seed_1[:1], randoms, planned=plan))
    assert "Incomplete at K = 8, in no table here: decoupled PPO + KL stop (1 of 9 runs)." in lines
    lines = remedy_grid.section(analyze.study_of(runs + seed_1 + [run("TaskA-v4", kl, 8, 2, 0)], randoms,
                                                 planned=plan, reps=200))
    text = "\n".join(lines)
    assert "on seed 1 (4 of the 9 runs planned at K = 8 are in: a screen, until the rest are)" in text
    assert "| TaskA-v4 | 100 [98, 102] | 60 [58, 62] | 90 [88, 92] | 120 (1 seed) | 3 of 3 / 3 of 3 | 0 of 9 / 9 of 9 |" \
        in lines
    assert "| TaskB-v4 | 100 [98, 102] | 60 [58, 62] | 90 [88, 92] | 100 (1 seed) | 1 of 3 / 3 of 3 | 0 of 9 / 9 of 9 |" \
        in lines
    assert ("Clearly behind synchronous PPO: decoupled PPO + KL stop on 1 task (TaskC-v4); decoupled PPO on 3 tasks "
            "(TaskA-v4, TaskB-v4, TaskC-v4). Clearly behind PPO at K = 8: decoupled PPO + KL stop on 1 task (TaskC-v4); "
            "decoupled PPO on 0 tasks.") in lines
    assert "IQM" not in text  # no aggregate of a screen
    cells = [[c.strip(" *") for c in line.split("|")[2:-1]] for line in lines if line.startswith("| 8 |")]
    rows = {(seeds, task): shares for seeds, task, _, _, *shares in cells}  # against PPO, against itself
    assert list(rows) == [("1; 1", "TaskA-v4"), ("1; 1", "TaskB-v4"), ("1; 1", "median")]  # TaskC ran no K = 1
    assert rows[("1; 1", "TaskA-v4")][0].startswith("1.50 [") and rows[("1; 1", "TaskA-v4")][1].startswith("1.00 [")
    assert rows[("1; 1", "TaskB-v4")][0].startswith("1.00 [") and rows[("1; 1", "TaskB-v4")][1].startswith("2.67 [")
    assert rows[("1; 1", "median")][0].startswith("1.25 [") and rows[("1; 1", "median")][1].startswith("1.83 [")
    assert "At K = 1, 2 of the 6 runs planned at K = 1 are in: a screen, until the rest are." in lines
    # every seed in, and a K = 32 block on TaskA, where the KL stop without lag ends below PPO at K = 32
    everything = [run(t, kl, k, s, final) for t in tasks for k, final in ((8, 120), (1, 120)) for s in (1, 2, 3)
                  if k == 8 or t != "TaskC-v4"]
    everything += [run("TaskA-v4", a, 32, s, final) for a, final in (("ppo", 20), (kl, 40)) for s in (1, 2, 3)]
    everything[3:6] = [run("TaskA-v4", kl, 1, s, 10) for s in (1, 2, 3)]
    lines = remedy_grid.section(analyze.study_of(runs + everything, randoms, planned=plan, reps=200))
    text = "\n".join(lines)
    assert "on seeds 1, 2, 3, beside PPO" in text and "screen" not in text
    assert lines[2] == "<!-- --8<-- [start:remedy_grid_ppo_decoupled_kl_0_015] -->"  # a name the docs can include
    assert "| TaskA-v4 | 100 [98, 102] | 60 [58, 62] | 90 [88, 92] | 120 [120, 120] | 9 of 9 / 9 of 9 | 0 of 9 / 9 of 9 |" in text
    assert "IQM of the normalised final score at K = 8 (1 = PPO at K = 1) over the 3 tasks: PPO 0.60 [" in text
    k32 = [[c.strip(" *") for c in line.split("|")[3:-1]] for line in lines if line.startswith("| 32 |")]
    assert k32[0][0] == "TaskA-v4" and k32[0][3].startswith("0.25 [") and k32[0][4] == "—"  # (40 - 20) / (100 - 20)
    assert k32[1][0] == "median" and k32[1][4] == "—"  # no task with a loss to win back against itself
    k8 = [[c.strip(" *") for c in line.split("|")[3:-1]] for line in lines if line.startswith("| 8 |")]
    assert k8[2][0] == "median" and k8[2][4].startswith("1.00 [")  # TaskB only: TaskA has no loss of its own
