"""How far the GOLDEN model drifts from itself under rounding-sized noise.

A free-running comparison of logits after many layers measures two things at once: the
kernels' rounding differences and how much the model amplifies any difference.  This
module measures the second alone: the golden forward run twice over the same feeds, the
second time with, after every site, a fraction of its residual-lane elements moved by one
BF16 unit in the last place relative (``x * (1 +- 2^-8)``, the size of one BF16 rounding
flip).  The logits' per-row ratio between the two runs is the drift a perfectly correct
but not bit-identical implementation can show on this checkpoint.
"""

from __future__ import annotations

import torch

from goldens.forward import GoldenModel, PagedCaches
from harness.compare.rows import row_bound_ratios

ULP_REL = 2.0 ** -8  # one BF16 unit in the last place, relative


def _nudge(fraction: float, gen: torch.Generator):
    def hook(layer, kind, x_hc, pre):
        pick = torch.rand(x_hc.shape, generator=gen) < fraction
        sign = torch.where(torch.rand(x_hc.shape, generator=gen) < 0.5, -1.0, 1.0)
        x_hc.mul_(torch.where(pick, 1.0 + sign * ULP_REL, torch.ones_like(x_hc)))  # in place: carried on
    return hook


def golden_self_drift(golden: GoldenModel, prompts: list[list[int]], feeds: list[list[list[int]]], *,
                      fraction: float = 1e-3, seed: int = 0, page_seed: int | None = None) -> dict:
    """Run ``feeds`` (per step, per request ids: the prompts, then the tokens fed) through
    the golden twice, the second run nudged (see the module doc); returns
    ``{"fraction", "worst_logit_row_ratio", "step_ratios", "ids_equal"}``."""
    lengths = [len(p) + len(feeds) - 1 for p in prompts]
    gen = torch.Generator().manual_seed(seed)
    runs = []
    for hook in (None, _nudge(fraction, gen)):
        pc = PagedCaches.for_lengths(golden.config, lengths, page_seed=page_seed)
        rids = list(range(len(prompts)))
        for r in rids:
            pc.add(r)
        outs = []
        for step in feeds:
            rows = [len(f) for f in step]
            ids = torch.tensor([t for f in step for t in f], dtype=torch.int64)
            outs.append(golden.forward(ids, pc.batch(rids, rows), pc.caches, on_site=hook))
            pc.advance(rids, rows)
        runs.append(outs)
    ratios = [float(row_bound_ratios(b.logits, a.logits).max()) for a, b in zip(*runs)]
    return {"fraction": fraction, "worst_logit_row_ratio": max(ratios), "step_ratios": ratios,
            "ids_equal": all(bool(torch.equal(a.next_ids, b.next_ids)) for a, b in zip(*runs))}
