# ci: a5
"""One decode Block per mode on v41 kernels (``decode_layer_<mode>``: the attention
composition then the moe composition, sharded residual slabs, EP = DP x TP)."""

import pytest

from harness.entries import decode_layer
from harness.pytest_cases import ARGNAMES, check_case, entry_params

NAMES = sorted(decode_layer.ENTRIES)


@pytest.mark.parametrize(ARGNAMES, [p for name in NAMES for p in entry_params(name)])
def test_decode_layer(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
