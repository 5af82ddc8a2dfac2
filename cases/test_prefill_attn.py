# ci: a5
"""The six prefill attention leaves (``prefill_attn_<mode>``) on v41 kernels, replicated
output; one test per entry so ``-k c1a_reindex`` and ``--tp`` select exactly the cases."""

import pytest

from harness.entries import prefill_attn
from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, [p for name in sorted(prefill_attn.ENTRIES)
                                    for p in entry_params(name)])
def test_prefill_attn(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
