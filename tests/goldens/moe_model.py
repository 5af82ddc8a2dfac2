"""Shared by the goldens' MoE tests: a random TINY-sized MoE problem (activations, routed
experts quantized MXFP4, the shared expert MXFP8, and the router's choice)."""

from __future__ import annotations

import torch

from goldens.moe import quantize_routed_expert, quantize_shared_expert
from goldens.router import route


def tiny_moe(seed: int, t: int, cfg):
    """``(x, indices, weights, experts, shared)`` for ``t`` tokens under ``cfg`` (its
    hidden, intermediate and expert sizes), deterministic in ``seed``."""
    e, d, i = cfg.moe.n_routed_experts, cfg.hidden_size, cfg.moe.intermediate_size
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, d, generator=gen) * 1.5).to(torch.bfloat16)

    def three():
        return (torch.randn(i, d, generator=gen) * 0.08, torch.randn(i, d, generator=gen) * 0.08,
                torch.randn(d, i, generator=gen) * 0.1)
    experts = [quantize_routed_expert(*three()) for _ in range(e)]
    shared = quantize_shared_expert(*three())
    gate = torch.randn(e, d, generator=gen) * 0.05
    bias = torch.randn(e, generator=gen) * 0.1
    idx, wt = route(x, gate, bias, cfg)
    return x, idx, wt, experts, shared
