# ci: a5
"""mHC mixes kernel vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("hc_mixes"))
def test_hc_mixes(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
