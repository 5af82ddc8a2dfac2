"""Checks of a kernel forward against the golden, site by site.

* :func:`replay_site`: the golden site REPLAYED on the kernel site's own inputs (its input
  lanes, delayed pre-mix and, for Attention, rank 0's caches as the site found them):
  ``goldens.forward.attention_site`` / ``ffn_site``; the head: ``hc_head`` +
  ``final_norm`` on the kernel's last lanes and ``lm_head`` on the kernel's own gathered
  hidden rows.  Every active row by the contract's per-row bound: this is the proof that
  every site computed what the golden computes from the same input, so a difference is
  never charged twice down the layers.
"""

from __future__ import annotations

import copy


from goldens.boundary import final_norm, lm_head
from goldens.forward import attention_site, ffn_site
from goldens.mhc import hc_head
from goldens.modes import owned_keys
from harness.compare import check_row_bound
from harness.compare.rows import row_bound_ratios


def _pairs(config, golden, batch, trace):
    """``[(output name, actual rows, reference rows)]`` of one site's replay."""
    n, d = batch.active, config.hidden_size
    name = "head" if trace.kind == "head" else f"L{trace.layer}.{trace.kind}"
    if trace.kind == "head":
        hidden = final_norm(hc_head(trace.x_in, trace.pre_in, config), golden.weights.final_norm(), config)
        logits = lm_head(trace.logit_rows, golden.weights.head(), config)
        return [(f"{name}.hidden", trace.x_out[:n], hidden[:n]), (f"{name}.logits", trace.logits, logits)]
    if trace.kind == "attn":
        x, pre = attention_site(config, trace.layer, trace.x_in, trace.pre_in,
                                golden.weights.attention_site(trace.layer), copy.deepcopy(trace.caches), batch,
                                golden.rope)
    else:
        x, pre = ffn_site(config, trace.x_in, trace.pre_in, golden.weights.ffn_site(trace.layer), n)
    return [(f"{name}.x_hc", trace.x_out[:n].reshape(-1, d), x[:n].reshape(-1, d)),
            (f"{name}.pre", trace.pre_out[:n], pre[:n])]


def ownership_problems(config, trace) -> list[str]:
    """An Attention site's cache writes outside what its mode owns (``goldens.modes.
    owned_keys``: the layer's own window, and its publications where it is a source), per
    rank, and ranks whose cache replicas no longer agree byte for byte."""
    if trace.kind != "attn":
        return []
    owned = owned_keys(config, trace.layer)
    out = [f"L{trace.layer}.attn rank {r}: wrote caches it does not own: {sorted(ch - owned)}"
           for r, ch in enumerate(trace.changed or []) if ch - owned]
    if not trace.replicas_equal:
        out.append(f"L{trace.layer}.attn: the ranks' cache replicas differ after the site")
    return out


def replay_site(config, golden, batch, trace, rows: dict | None = None) -> tuple[list, float]:
    """``(verdicts, worst row ratio)`` of the golden site replayed on ``trace``'s inputs;
    ``rows``, when given, receives each output's per-row ratios (``"head.logits"``: the
    step's logit rows against the golden's ``lm_head`` on the kernels' own hidden rows)."""
    verdicts, worst = [], 0.0
    for name, actual, ref in _pairs(config, golden, batch, trace):
        verdicts += check_row_bound(name, actual, ref)
        if actual.numel():
            ratios = row_bound_ratios(actual, ref)
            worst = max(worst, float(ratios.max()))
            if rows is not None:
                rows[name] = ratios
    return verdicts, worst
