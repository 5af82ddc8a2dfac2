"""Top-K acceptance for C1A Full and Reindex (contract: "validate Top-K eligibility,
uniqueness, logical-position ordering, trailing -1 padding, and cutoff score quality").

Per token the kernel emits physical cache rows padded with -1.  They are mapped back to
logical compressed positions through the request's block table; the reference scores
(FP32, over logical positions, as the reference computed them) judge eligibility and the
cutoff.  A selection that differs from the nominal one is accepted when every missing
reference position is matched by a replacement scoring at most
``5e-5 + 1.5e-2*|missing|`` below it (missing sorted descending, replacements
ascending).  The caller must then recompute the output reference for the accepted
selection from reference cache values and original weights (``TopKResult.differs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from harness.compare._common import require_same_shape
from harness.verdict import Verdict, summarize

CUTOFF_ATOL = 5e-5
CUTOFF_RTOL = 1.5e-2


@dataclass(frozen=True)
class TopKResult:
    """Verdicts ``topk_padding``, ``topk_eligible``, ``topk_unique``, ``topk_order``,
    ``topk_count``, ``topk_cutoff`` (row = token); ``differs`` is True when any token's
    selected set differs from the reference set (``differing_tokens`` lists them)."""

    verdicts: tuple[Verdict, ...]
    differs: bool
    differing_tokens: tuple[int, ...]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)


def _inverse_tables(block_table: np.ndarray, token_to_req: np.ndarray, visible: np.ndarray, page: int):
    """Per request: physical page -> logical page, over the pages its tokens can see."""
    maps: dict[int, dict[int, int]] = {-1: {}}  # padding tokens (request -1) see nothing
    for req in np.unique(token_to_req[token_to_req >= 0]):
        need = -(-int(visible[token_to_req == req].max(initial=0)) // page)
        pages = block_table[req, :need].tolist()
        inv = {p: i for i, p in enumerate(pages) if p >= 0}
        if len(inv) != sum(p >= 0 for p in pages):
            raise ValueError(f"block table row {req} maps one physical page twice within {need} visible pages")
        maps[int(req)] = inv
    return maps


def _logical(phys: int, inv: dict[int, int], page: int) -> int | None:
    lp = inv.get(phys // page)
    return None if lp is None else lp * page + phys % page


def check_topk(
    output: str,
    actual_rows: torch.Tensor,
    ref_rows: torch.Tensor,
    scores: torch.Tensor,
    visible_lens: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    *,
    page_size: int = 128,
    candidate_mask: torch.Tensor | None = None,
    topk: int | None = None,
    cutoff_atol: float = CUTOFF_ATOL,
    cutoff_rtol: float = CUTOFF_RTOL,
) -> TopKResult:
    """Judge ``actual_rows`` ``[T, K]`` (physical rows, -1 padded) against ``ref_rows``.

    ``scores`` ``[T, W]``: reference FP32 score of each logical position; ``visible_lens``
    ``[T]``: causal compressed length per token; ``block_table`` ``[B, pages]`` with
    ``token_to_req`` ``[T]`` maps logical position ``k`` to physical row
    ``table[req, k//page_size]*page_size + k%page_size``; ``candidate_mask`` ``[T, W]``
    (Reindex) limits eligibility; ``topk`` defaults to ``K``.  Expected count per token
    is ``min(topk, #eligible positions with finite score)``; a token with
    ``token_to_req < 0`` is padding and must hold only -1.  Every violation is a
    failing verdict, never an exception; inconsistent shapes or a reference row outside
    the map raise ValueError."""
    require_same_shape(output, actual_rows, ref_rows)
    if actual_rows.dim() != 2 or scores.dim() != 2 or scores.shape[0] != actual_rows.shape[0]:
        raise ValueError(f"{output}: need rows [T, K] and scores [T, W], got {tuple(actual_rows.shape)} "
                         f"and {tuple(scores.shape)}")
    n_tok, k_cols = actual_rows.shape
    width = scores.shape[1]
    topk = k_cols if topk is None else topk
    t2r = token_to_req.cpu().numpy().astype(np.int64)
    t2r[t2r < 0] = -1
    vis = np.where(t2r < 0, 0, visible_lens.cpu().numpy().astype(np.int64))
    maps = _inverse_tables(block_table.cpu().numpy().astype(np.int64), t2r, vis, page_size)
    sc = scores.detach().cpu().to(torch.float64)
    elig = (torch.arange(width)[None, :] < torch.from_numpy(vis)[:, None]) & torch.isfinite(sc)
    if candidate_mask is not None:
        require_same_shape(output, candidate_mask, scores, "scores")
        elig &= candidate_mask.cpu().bool()
    n_elig = elig.sum(dim=1).tolist()
    act, ref = actual_rows.cpu().tolist(), ref_rows.cpu().tolist()
    sc_np, elig_np = sc.numpy(), elig.numpy()

    counts = {c: np.zeros(n_tok) for c in ("padding", "eligible", "unique", "order", "count")}
    cut_meas, cut_bound, cut_tokens, differing = [], [], [], []
    for t in range(n_tok):
        inv = maps[int(t2r[t])]
        row = act[t]
        first_pad = next((i for i, p in enumerate(row) if p < 0), k_cols)
        chosen = [p for p in row if p >= 0]
        counts["padding"][t] = sum(p >= 0 for p in row[first_pad:]) + sum(p < -1 for p in row)
        logical = [_logical(p, inv, page_size) for p in chosen]
        counts["eligible"][t] = sum(q is None or q >= width or not elig_np[t, q] for q in logical)
        counts["unique"][t] = len(chosen) - len(set(chosen))
        mapped = [q for q in logical if q is not None]
        counts["order"][t] = sum(b < a for a, b in zip(mapped, mapped[1:]))
        counts["count"][t] = abs(len(chosen) - min(topk, n_elig[t]))
        ref_log = set()
        for p in (p for p in ref[t] if p >= 0):
            q = _logical(p, inv, page_size)
            if q is None or q >= width:
                raise ValueError(f"{output}: reference row {p} of token {t} is outside its visible pages")
            ref_log.add(q)
        act_log = {q for q in mapped if q < width}
        if act_log == ref_log:
            continue
        differing.append(t)
        missing = sorted((sc_np[t, q] for q in ref_log - act_log), reverse=True)
        repl = sorted(sc_np[t, q] for q in act_log - ref_log)
        pairs = [(m, m - r, cutoff_atol + cutoff_rtol * abs(m)) for m, r in zip(missing, repl)]
        if pairs:
            _, d, b = min(pairs, key=lambda x: -math.inf if math.isnan(x[1]) else x[2] - x[1])
            cut_meas.append(d)
            cut_bound.append(b)
            cut_tokens.append(t)

    tokens = list(range(n_tok))
    metric = {
        "padding": "entries >= 0 after the first -1, or below -1",
        "eligible": "selected rows unmapped, >= visible length, outside the candidate mask or non-finite",
        "unique": "duplicate rows",
        "order": "descents in logical position order",
        "count": f"|count - min({topk}, finite eligible positions)|",
    }
    verdicts = [summarize(output, f"topk_{c}", counts[c], 0.0, tokens, metric=metric[c]) for c in counts]
    cutoff = f"missing - replacement score <= {cutoff_atol:g} + {cutoff_rtol:g}*|missing|"
    verdicts.append(
        summarize(output, "topk_cutoff", cut_meas, cut_bound or cutoff_atol, cut_tokens, metric=cutoff))
    return TopKResult(tuple(verdicts), bool(differing), tuple(differing))
