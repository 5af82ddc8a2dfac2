# ci: a5
"""Routed MXFP4 experts kernel (one launch per EP rank, host dispatch) vs golden."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("routed_experts"))
def test_routed_experts(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
