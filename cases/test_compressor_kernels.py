# ci: a5
"""Compressor kernels (ratio 1 and ratio 2 with the state ring) vs the golden on the
selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("compressor_ratio1"))
def test_compressor_ratio1(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)


@pytest.mark.parametrize(ARGNAMES, entry_params("compressor_ratio2"))
def test_compressor_ratio2(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)


@pytest.mark.parametrize(ARGNAMES, entry_params("compressor_state"))
def test_compressor_state(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
