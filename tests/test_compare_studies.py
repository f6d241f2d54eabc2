"""benchmark/compare_studies.py: two folders of study runs, cell by cell, on synthetic runs whose
final returns are known."""

import os
import sys

import numpy as np
from test_study import write_run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark"))
import compare_studies  # noqa: E402


def test_a_cell_inside_and_a_cell_outside_the_reference_interval(tmp_path):
    reference, other = tmp_path / "reference", tmp_path / "other"
    reference.mkdir(), other.mkdir()
    # 10 updates of one episode each: the final return is the last update's (the last 10 % of steps)
    for seed, final in enumerate([100.0, 110.0, 120.0], start=1):
        write_run(str(reference), "Hopper-v4", "ppo", 1, seed, [0.0] * 9 + [final])
        write_run(str(reference), "Hopper-v4", "vaco", 8, seed, [0.0] * 9 + [final])
    for seed, final in enumerate([105.0, 115.0], start=1):
        write_run(str(other), "Hopper-v4", "ppo", 1, seed, [0.0] * 9 + [final])  # mean 110: inside
        write_run(str(other), "Hopper-v4", "vaco", 8, seed, [0.0] * 9 + [final + 100])  # mean 210: outside
    write_run(str(other), "Ant-v4", "ppo", 1, 1, [1.0] * 10)  # a cell the reference lacks: not compared
    text = compare_studies.table(compare_studies.final_returns(str(reference)),
                                 compare_studies.final_returns(str(other)), ["eager", "compiled"])
    half = 10 / np.sqrt(3) * 4.302653  # t(0.975, 2) x the standard error of 100, 110, 120
    assert f"| Hopper-v4 | ppo | 1 | 110 [{110 - half:.0f}, {110 + half:.0f}] (3) | 110 ± 5 (2) | yes |" in text
    assert "| Hopper-v4 | vaco | 8 |" in text and text.count("| no |") == 1 and "Ant-v4" not in text
    assert text.endswith("1 of 2 cells: the compiled mean lies inside the eager interval.")
