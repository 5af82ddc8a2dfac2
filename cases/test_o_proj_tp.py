# ci: a5
"""Output projection kernel (every TP rank's FP32 partial, host all-reduce) vs golden."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("o_proj"))
def test_o_proj(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
