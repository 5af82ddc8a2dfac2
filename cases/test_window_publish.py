# ci: a5
"""Window KV publication (MXFP8 quantization at window slots) kernel vs golden on the
selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("window_publish"))
def test_window_publish(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
