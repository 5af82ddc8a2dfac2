"""The comparison vocabulary: every comparator returns a list of
:class:`~harness.verdict.Verdict` (one per check) and never raises on bad data.

One module per family: ``rows`` (contract per-row bound, zero rows, sentinels),
``budget`` (C2A attention budget), ``ratio`` (bounded-outlier elementwise gates),
``cache`` (ownership bytes, dequantized published rows, state ring), ``replicas``
(TP byte identity), ``topk`` (Top-K acceptance).
"""

from harness.compare.budget import C2A_MAX_REL_L2, C2A_MAX_ROW_REL_L2, C2A_MIN_COSINE, check_c2a_budget
from harness.compare.cache import (
    MXFP4_CACHE_MAX_REL_L2,
    MXFP8_CACHE_MAX_REL_L2,
    STATE_MAX_REL_L2,
    check_dequantized_rows,
    check_non_owned_bytes,
    check_state_rel_l2,
    check_state_ring,
)
from harness.compare.ratio import ratio_allclose, ratio_reldiff
from harness.compare.replicas import check_replicas
from harness.compare.rows import (
    PEAK_ATOL,
    PEAK_RTOL,
    RMS_ATOL,
    RMS_RTOL,
    check_row_bound,
    check_sentinel,
    check_zero_rows,
)
from harness.compare.topk import CUTOFF_ATOL, CUTOFF_RTOL, TopKResult, check_topk

__all__ = [
    "C2A_MAX_REL_L2", "C2A_MAX_ROW_REL_L2", "C2A_MIN_COSINE", "CUTOFF_ATOL", "CUTOFF_RTOL",
    "MXFP4_CACHE_MAX_REL_L2", "MXFP8_CACHE_MAX_REL_L2", "PEAK_ATOL", "PEAK_RTOL", "RMS_ATOL", "RMS_RTOL",
    "STATE_MAX_REL_L2", "TopKResult", "check_c2a_budget", "check_dequantized_rows", "check_non_owned_bytes",
    "check_replicas", "check_row_bound", "check_sentinel", "check_state_rel_l2", "check_state_ring", "check_topk",
    "check_zero_rows",
    "ratio_allclose", "ratio_reldiff",
]
