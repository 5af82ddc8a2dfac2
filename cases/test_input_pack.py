# ci: a5
"""Input pack kernel (embedding rows into the mHC lanes) vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("input_pack"))
def test_input_pack(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
