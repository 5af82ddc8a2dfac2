# ci: a5
"""Sparse attention (per-head sink, MXFP8 window + MXFP4 compressed caches; decode sizes and
host-chunked prefill sizes) kernel vs golden on the selected platform."""

import pytest

from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, entry_params("sparse_attention"))
def test_sparse_attention(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
