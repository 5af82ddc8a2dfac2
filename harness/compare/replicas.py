"""TP replicas: every rank of a TP group must produce byte-identical outputs.

Replicated outputs (the all-reduce wiring's hidden output, replicated caches, Top-K
rows) are compared by stored bytes against rank 0, so ``-0.0`` vs ``+0.0`` or two NaN
payloads count as differences: the ranks must run the same arithmetic in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.compare._common import as_rows, changed_elements, lead_shape, row_labels
from harness.verdict import Verdict, single


def check_replicas(
    output: str, replicas: Sequence[torch.Tensor], ranks: Sequence[int] | None = None
) -> list[Verdict]:
    """Verdict ``replica_bytes``: measured = number of ranks whose bytes differ from the
    first replica (bound 0).  ``row`` is ``(rank, row)`` of the first difference,
    ``failing_rows`` every differing ``(rank, row)``; the detail names the first
    differing rank, its first changed flat index and the count.  ``ranks`` labels the
    replicas (default ``0..n-1``).  Differing shapes or dtypes are misuse (ValueError)."""
    if not replicas:
        raise ValueError(f"{output}: no replicas to compare")
    ranks = list(range(len(replicas))) if ranks is None else list(ranks)
    if len(ranks) != len(replicas):
        raise ValueError(f"{output}: {len(ranks)} rank labels for {len(replicas)} replicas")
    base = replicas[0]
    failing: list = []
    differing: list[int] = []
    first_note = ""
    for rank, rep in zip(ranks[1:], replicas[1:]):
        changed = changed_elements(f"{output} rank {rank} vs rank {ranks[0]}", rep, base)
        if not bool(changed.any()):
            continue
        per_row = as_rows(changed.reshape(base.shape) if base.dim() else changed, torch.int64).sum(dim=-1)
        rows = row_labels(per_row.nonzero().flatten().numpy(), lead_shape(base))
        failing += [(rank, r) for r in rows]
        differing.append(rank)
        if not first_note:
            first = int(changed.nonzero()[0])
            first_note = (f"rank {rank} differs from rank {ranks[0]} at flat index {first} (row {rows[0]}): "
                          f"{int(changed.sum())} elements in {len(rows)} rows")
    note = first_note + (f"; differing ranks {differing}" if differing else "")
    return [single(output, "replica_bytes", float(len(differing)), 0.0, row=failing[0] if failing else None,
                   failing_rows=failing, n_checked=len(replicas),
                   metric=f"ranks not byte-identical to rank {ranks[0]}",
                   note=note or f"{len(replicas)} replicas byte-identical")]
