"""Every v41 kernel's TINY cases pass with pass-level verification (``verify="lowered"``):
the tensor graph and each lowering pass through InferDynShape agree on the real inputs, and
the outputs pass the entry's comparison.

The composed entries (the attention leaves and mHC compositions: ``decode_attn_*``,
``decode_*``, ``prefill_attn_*``, ``prefill_*``, and the ``moe`` composition) launch only
building-block modules that have lowered TINY cases of their own (``v41.moe_combine``, which
has no entry: ``tests/platforms/test_a5sim_moe_combine.py``); by default one TP1 case of the
widest chain is lowered (C2A Full: the ratio-2 ring, the indexer and the mHC kernels, via its
composition) and every other composed case is lowered under ``slow`` (75-450 s each at this
level).  A building block's first TINY case is lowered by default, any further ones under
``slow``: the default run's budget (well under 30 minutes on two cores) buys one lowered
case per module."""

from __future__ import annotations

import pytest

from harness import registry
from harness.runner import run_case


COMPOSED = ("decode_", "prefill_", "moe")  # attention leaves and mHC / MoE compositions
DEFAULT_COMPOSED = ("decode_c2a_full",)
BLOCK_DEFAULT_CASES = 1  # a building block's first TINY case lowered by default, the rest slow


def _lowered_by_default(case) -> bool:
    if not case.entry.startswith(COMPOSED):
        return True
    return case.entry in DEFAULT_COMPOSED and case.tp * case.dp == 1 and case.wiring == "replicated"


def _lowered_cases(entry):
    """The entry's TINY cases, plus (composed entries) its first TINY slow case when the
    default matrix has no TP1 case to lower, or when it has no default case at all."""
    cases = [c for c in entry.matrix if c.preset == "tiny"]
    if entry.name in DEFAULT_COMPOSED and not any(_lowered_by_default(c) for c in cases):
        cases += [c for c in entry.slow_cases if c.preset == "tiny" and _lowered_by_default(c)][:1]
    if not cases:  # an entry whose TINY cases are all slow: its first one, lowered under slow
        cases = [c for c in entry.slow_cases if c.preset == "tiny"][:1]
    return cases


def _kernel_tiny_cases():
    params = []
    for name, entry in registry.entries().items():
        if not entry.sut_for("a5sim")[0].startswith("kernel:"):
            continue
        params += [pytest.param(case, id=case.case_id,
                                marks=() if _lowered_by_default(case) and i < BLOCK_DEFAULT_CASES
                                else pytest.mark.slow)
                   for i, case in enumerate(_lowered_cases(entry))]
    return params


def test_every_kernel_entry_has_a_tiny_case():
    kernels = {n for n, e in registry.entries().items()
               if e.sut_for("a5sim")[0].startswith("kernel:")}
    covered = {p.values[0].entry for p in _kernel_tiny_cases()}
    assert kernels and covered == kernels
    default = [p.values[0] for p in _kernel_tiny_cases() if not p.marks]
    assert {c.entry for c in default if c.entry.startswith(COMPOSED)} == set(DEFAULT_COMPOSED)


@pytest.mark.parametrize("case", _kernel_tiny_cases())
def test_tiny_case_passes_at_lowered(lowered, case):
    result = run_case(case, platform=lowered)
    assert result.status == "pass", result.failure_text()
    assert result.verify_level == "lowered"
