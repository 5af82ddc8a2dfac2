# ci: a5
"""LM head kernel (TP vocab shards, greedy pick, host rank combine) vs golden on the selected
platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("lm_head"))
def test_lm_head(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
