# ci: a5
"""hc_pre kernel vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("hc_pre"))
def test_hc_pre(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
