# ci: a5
"""MoE router gate kernel vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("gate"))
def test_gate(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
