# ci: a5
"""The six attention modes on the selected platform: the decode leaves
(``decode_attn_<mode>``) and mHC compositions (``decode_<mode>``) and the prefill
sequence-parallel compositions (``prefill_<mode>``) on v41 kernels, and the golden-alt
recompositions (``golden_alt_decode_attn_<mode>``, ``golden_alt_prefill_attn_<mode>``).
The prefill leaves are in ``test_prefill_attn.py``.

One test per entry so ``-k c1a_reindex`` and ``--tp 4`` select exactly the wanted cases.
"""

import pytest

from harness.entries import attention, decode_compose
from harness.pytest_cases import ARGNAMES, check_case, entry_params

NAMES = sorted(n for n in {**attention.ENTRIES, **decode_compose.ENTRIES, **decode_compose.PREFILL_ENTRIES}
               if not n.startswith("prefill_attn_"))  # those run once, in test_prefill_attn.py


@pytest.mark.parametrize(ARGNAMES, [p for name in NAMES for p in entry_params(name)])
def test_attention_mode(case, tp, dp, ep, wiring, preset, run_options):
    check_case(case, run_options)
