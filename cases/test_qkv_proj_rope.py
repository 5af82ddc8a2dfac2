# ci: a5
"""Q / KV projection with RoPE kernel (one TP rank's heads per launch) vs golden."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("qkv_proj_rope"))
def test_qkv_proj_rope(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
