# ci: a5
"""The ``moe`` composition (MoE half of the Block with EP dispatch and combine) on v41
kernels; ``-k moe --ep 4`` selects exactly the EP4 cases (TP2 DP2 and TP4 DP1)."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("moe"))
def test_moe(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
