"""Record what the row-bound and cache-ownership comparators measured, row by row.

A :class:`~harness.verdict.Verdict` keeps the worst row and the failing rows, not every
row's value.  :func:`capture` runs an entry's comparison with ``check_row_bound`` and
``check_non_owned_bytes`` wrapped wherever a module holds them (entries import them by
name), so each call is recorded with its own numbers:

* a row-bound call keeps the per-row measured values and bounds exactly as its
  comparator summarized them (``row_rms``, ``row_peak``, ``finite``), the selected actual
  and reference rows, and the verdicts it returned;
* an ownership call keeps, per slot (row over the leading dims), the number of elements
  whose stored bytes changed and whether the mode owns that slot.

The wrappers are installed for the ``with`` block only and restored after it (not
thread-safe: use it in the thread that runs the comparison).
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from harness.compare import _common, cache
from harness.compare import rows as rows_mod
from harness.verdict import Verdict, summarize


@dataclass
class RowBoundCall:
    """One ``check_row_bound`` call: ``checks[name] = (measured, bound)`` per selected row."""

    output: str
    labels: list
    actual: torch.Tensor  # [n, D] float64, the selected rows
    ref: torch.Tensor
    checks: dict[str, tuple[np.ndarray, np.ndarray]]
    verdicts: list[Verdict]


@dataclass
class OwnershipCall:
    """One ``check_non_owned_bytes`` call: per slot, changed elements and ownership."""

    output: str
    lead: tuple[int, ...]  # the tensor's leading dims (slots = their product)
    changed: np.ndarray  # int64 per slot
    owned: np.ndarray  # bool per slot
    verdicts: list[Verdict]


@dataclass
class Capture:
    row_bound: list[RowBoundCall] = field(default_factory=list)
    ownership: list[OwnershipCall] = field(default_factory=list)


_SUMMARIZE = inspect.signature(summarize)


def _row_bound_spy(original, sink: Capture):
    def spy(output, actual, ref, rows=None, **tol):
        seen = {}

        def recording_summarize(*args, **kwargs):
            b = _SUMMARIZE.bind(*args, **kwargs).arguments
            n = len(b["labels"])
            seen[b["check"]] = (np.asarray(b["measured"], dtype=np.float64).reshape(-1),
                                np.broadcast_to(np.asarray(b["bound"], dtype=np.float64),
                                                (n,)).copy())
            return summarize(*args, **kwargs)

        saved, rows_mod.summarize = rows_mod.summarize, recording_summarize
        try:
            verdicts = original(output, actual, ref, rows, **tol)
        finally:
            rows_mod.summarize = saved
        a, labels = _common.selected_rows(output, actual, rows)
        r, _ = _common.selected_rows(output, ref, rows)
        sink.row_bound.append(RowBoundCall(output, labels, a, r, seen, list(verdicts)))
        return verdicts
    return spy


def _ownership_spy(original, sink: Capture):
    def spy(output, actual, ref, owned=None):
        verdicts = original(output, actual, ref, owned)
        changed = _common.changed_elements(output, actual, ref)
        per_slot = _common.as_rows(changed.reshape(actual.shape) if actual.dim() else changed,
                                   torch.int64).sum(dim=-1).numpy()
        n = per_slot.shape[0]
        mask = (_common.row_mask(output, owned, n) if owned is not None
                else np.zeros(n, dtype=bool))
        sink.ownership.append(OwnershipCall(output, _common.lead_shape(actual), per_slot,
                                            mask, list(verdicts)))
        return verdicts
    return spy


@contextmanager
def capture():
    """Yield a :class:`Capture` filled by every row-bound and ownership check run inside
    the block (in any module that imported the comparator by name)."""
    sink = Capture()
    spies = {id(f): (f, spy(f, sink)) for f, spy in (
        (rows_mod.check_row_bound, _row_bound_spy),
        (cache.check_non_owned_bytes, _ownership_spy))}
    patched = []
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            hit = spies.get(id(value))
            if hit is not None and hit[0] is value:
                namespace[name] = hit[1]
                patched.append((namespace, name, value))
    try:
        yield sink
    finally:
        for namespace, name, value in patched:
            namespace[name] = value
