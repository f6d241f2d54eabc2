"""benchmark/study/compare.py: two folders of study runs, cell by cell, on synthetic runs whose
final returns are known."""

import numpy as np
import pytest
from test_study import write_run

from benchmark.study import compare

pytestmark = pytest.mark.floatfree  # the comparison, in numpy, of results it is given


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
    text = compare.table(compare.final_returns(str(reference)),
                         compare.final_returns(str(other)), ["eager", "compiled"])
    half = 10 / np.sqrt(3) * 4.302653  # t(0.975, 2) x the standard error of 100, 110, 120
    their_half = 5 / np.sqrt(1) * 12.7062  # t(0.975, 1) x the standard error of 105, 115
    assert (f"| Hopper-v4 | ppo | 1 | 110 [{110 - half:.0f}, {110 + half:.0f}] (3) "
            f"| 110 [{110 - their_half:.0f}, {110 + their_half:.0f}] (2) | yes | yes |") in text
    # 210 [146, 274] and 110 [85, 135]: neither mean inside the other's interval
    assert f"| Hopper-v4 | vaco | 8 | 110 [{110 - half:.0f}, {110 + half:.0f}] (3) | 210 [146, 274] (2) | no | no |" in text
    assert "Ant-v4" not in text
    assert text.endswith("1 of 2 cells: the compiled mean lies inside the eager interval; "
                         "1 of 2: at least one mean lies inside the other's interval.")


def test_a_narrow_reference_interval_is_checked_both_ways(tmp_path):
    """Three seeds that agree closely give the reference a narrow interval that a close mean misses;
    the other folder's wider interval then holds the reference's mean."""
    reference, other = tmp_path / "reference", tmp_path / "other"
    reference.mkdir(), other.mkdir()
    for seed, (mine, theirs) in enumerate([(1700.0, 1620.0), (1701.0, 1690.0), (1702.0, 1650.0)], start=1):
        write_run(str(reference), "HalfCheetah-v4", "ppo", 1, seed, [0.0] * 9 + [mine])
        write_run(str(other), "HalfCheetah-v4", "ppo", 1, seed, [0.0] * 9 + [theirs])
    text = compare.table(compare.final_returns(str(reference)),
                         compare.final_returns(str(other)), ["eager", "compiled"])
    assert "| 1701 [1699, 1703] (3) | 1653 [1566, 1741] (3) | no | yes |" in text
    assert text.endswith("0 of 1 cells: the compiled mean lies inside the eager interval; "
                         "1 of 1: at least one mean lies inside the other's interval.")
