"""A checkpoint's site weights in the form the v41 kernels' ABIs take.

The golden reads :class:`goldens.forward.CheckpointWeights` as released (norms and most
dense weights FP32 holding BF16 values, MXFP8 payloads as E4M3, MXFP4 experts packed
UINT8).  The kernels take the same bytes with the ABI's dtypes: a BF16 argument is the
checkpoint's FP32 tensor cast to BF16, which is refused unless the cast is exact (the
kernel must see the checkpoint's values, not a rounding of them); E4M3 payloads are
handed over as their UINT8 codes.  Nothing is dequantized here.
"""

from __future__ import annotations

import dataclasses

import torch

from goldens.config import V41Config
from goldens.modes import ModeWeights

EXPERT_FIELDS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def exact_bf16(t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` as BF16; ValueError naming ``what`` unless every value survives the cast."""
    if t.dtype == torch.bfloat16:
        return t
    b = t.to(torch.bfloat16)
    if not bool((b.to(t.dtype) == t).all()):
        raise ValueError(f"{what}: {t.dtype} values not representable in bfloat16 (the kernel "
                         f"ABI takes bfloat16; the checkpoint's values would be rounded)")
    return b


def codes(t: torch.Tensor) -> torch.Tensor:
    """A one-byte payload (E4M3 / E8M0 / packed E2M1) as its UINT8 codes (a view)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def attention_site(config: V41Config, layer: int, site) -> tuple[dict, ModeWeights]:
    """``(mHC flat, mode weights)`` of ``layer``'s Attention site
    (:class:`goldens.forward.AttentionSiteWeights`): ``w.hc.{fn,scale,base}`` FP32 and
    ``w.attn_norm`` BF16 for the mHC kernels; the mode's weights with the ratio-1
    compressor's ``wkv`` in BF16 (its ABI) and everything else as the checkpoint holds it."""
    flat = {"w.hc.fn": site.hc.fn, "w.hc.scale": site.hc.scale, "w.hc.base": site.hc.base,
            "w.attn_norm": exact_bf16(site.norm, f"layer {layer} attn_norm")}
    mw = site.attention
    comp = mw.compressor
    if comp is not None and config.layer_config(layer).ratio == 1:
        comp = dataclasses.replace(comp, wkv=exact_bf16(comp.wkv, f"layer {layer} compressor.wkv"))
    return flat, ModeWeights(mw.mode, mw.attn, comp, mw.indexer)


def ffn_site(config: V41Config, layer: int, site) -> dict:
    """The ``moe`` composition's flat weights of ``layer``'s FFN site
    (:class:`goldens.forward.FfnSiteWeights`): ``w.hc.*``, ``w.ffn_norm`` BF16,
    ``w.gate.{weight,bias}`` FP32, ``w.shared.*`` UINT8 codes + scales, and the routed
    experts' packed MXFP4 ``w.routed.*`` stacked ``[E, ...]`` (read one expert at a time)."""
    flat = {"w.hc.fn": site.hc.fn, "w.hc.scale": site.hc.scale, "w.hc.base": site.hc.base,
            "w.ffn_norm": exact_bf16(site.norm, f"layer {layer} ffn_norm"),
            "w.gate.weight": site.gate_weight.to(torch.float32),
            "w.gate.bias": site.gate_bias.to(torch.float32)}
    for f in EXPERT_FIELDS:
        flat[f"w.shared.{f}"] = codes(getattr(site.shared, f))
    routed = [site.experts[e] for e in range(config.moe.n_routed_experts)]
    for f in EXPERT_FIELDS:
        flat[f"w.routed.{f}"] = torch.stack([codes(getattr(x, f)) for x in routed])
    return flat
