"""Shared by the goldens' mode tests: random published history in every cache of a
:class:`goldens.modes.ModelCaches` (window rows published as MXFP8, compressed KV and
index keys quantized by the golden's MXFP4 rules, FP32 state rings)."""

from __future__ import annotations

import torch

from goldens.quant import quantize_compressed_kv, quantize_index_key
from goldens.window_cache import publish_window_kv


def fill_history(caches, config, g: torch.Generator) -> None:
    """Fill every window, compressed source and state ring of ``caches`` from ``g``."""
    bs = config.cache.block_size
    for wc in caches.windows.values():
        kv = torch.randn(wc.rows, config.head_dim, generator=g).to(torch.bfloat16)
        publish_window_kv(wc.payload, wc.scales, kv, torch.arange(wc.rows))
    for sc in caches.sources.values():
        n = sc.num_blocks * bs
        p, s = quantize_compressed_kv(torch.randn(n, config.head_dim, generator=g),
                                      config.cache.compressed_group)
        sc.compressed_kv.copy_(p.view(sc.compressed_kv.shape))
        sc.compressed_kv_scale.view(torch.uint8).copy_(
            s.view(torch.uint8).view(sc.compressed_kv_scale.shape))
        p, s = quantize_index_key(torch.randn(n, config.index.head_dim, generator=g),
                                  config.cache.index_group)
        sc.index_key.copy_(p.view(sc.index_key.shape))
        sc.index_key_scale.copy_(s.view(sc.index_key_scale.shape))
    for st in caches.states.values():
        st.copy_(torch.randn(st.shape, generator=g))
