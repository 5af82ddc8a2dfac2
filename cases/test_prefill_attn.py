# ci: a5
"""The six prefill attention leaves (``prefill_attn_<mode>``) on v41 kernels, replicated
output; one test per entry so ``-k c1a_reindex`` and ``--tp`` select exactly the cases."""

import pytest

from harness.entries import attention
from harness.pytest_cases import ARGNAMES, check_case, entry_params

NAMES = sorted(n for n in attention.ENTRIES if n.startswith("prefill_attn_"))


@pytest.mark.parametrize(ARGNAMES, [p for name in NAMES for p in entry_params(name)])
def test_prefill_attn(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
