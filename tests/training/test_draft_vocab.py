"""The draft vocabulary the NAR stage builds from the AR branch's outputs."""

from __future__ import annotations

import pytest

from yue2_jobs.training.draft_vocab import coverage_of, shortlist


def test_the_fewest_ids_that_reach_the_coverage():
    seqs = [[5, 5, 5, 5, 7, 7, 9, 2], [5, 7, 8, 2]]  # 5 x5, 7 x3, 2 x2, 8 x1, 9 x1 of 12
    assert shortlist(seqs, coverage=0.5) == [5, 7]  # 5 alone is 5/12 < 0.5
    assert shortlist(seqs, coverage=0.75) == [2, 5, 7]  # 10/12
    assert shortlist(seqs, coverage=0.9) == [2, 5, 7, 8]  # ties: the lower id first
    assert shortlist(seqs, coverage=1.0) == [2, 5, 7, 8, 9]
    assert shortlist(seqs, coverage=0.5, always=[2]) == [2, 5, 7]
    assert coverage_of([2, 5, 7], seqs) == pytest.approx(10 / 12)


def test_coverage_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="coverage"):
        shortlist([[1]], coverage=0.0)
