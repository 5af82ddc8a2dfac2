# ci: a5
"""Indexer query kernel (index q with RoPE tails, scaled head weights) vs golden."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("index_query"))
def test_index_query(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
