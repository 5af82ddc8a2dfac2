# ci: a5
"""The six attention modes, decode and prefill, on the selected platform.

One test per entry so ``-k c1a_reindex`` and ``--tp 4`` select exactly the wanted cases.
"""

import pytest

from harness.entries.attention import ENTRIES
from harness.pytest_cases import ARGNAMES, check_case, entry_params


@pytest.mark.parametrize(ARGNAMES, [p for name in sorted(ENTRIES) for p in entry_params(name)])
def test_attention_mode(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
