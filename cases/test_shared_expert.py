# ci: a5
"""MoE shared expert kernel (MXFP8 SwiGLU, weights decoded in-kernel, padding rows zero)
vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("shared_expert"))
def test_shared_expert(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
