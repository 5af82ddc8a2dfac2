"""mHC golden: manifold-constrained hyper-connection mixes, collapse, expand, head.

The residual stream of V4.1 is ``hc_mult`` lanes ``x_hc [T, hc_mult, D]`` held in FP32
(every value a BF16 value after the first expand).  Each site (Attention or FFN) computes
three coefficient sets from its input lanes with :func:`hc_mixes`:

* ``pre  [T, hc]``     collapse weights, ``sigmoid(.) + hc_eps`` (not normalized);
* ``post [T, hc]``     expand weights of the sublayer output, ``2 * sigmoid(.)``;
* ``comb [T, hc, hc]`` lane-mixing matrix ``M[in, out]``, Sinkhorn-projected.

V4.1 staggers ``pre`` by one site ("single-pass mHC"): a site collapses with the pre-mix
the PREVIOUS site computed (one-hot lane 0 at the very first site, :func:`initial_pre_mix`),
applies its own ``post``/``comb`` immediately and hands its own ``pre`` to the next site.
After the last layer :func:`hc_head` collapses with the last delayed pre-mix; there are no
learned head parameters.  HC mixes are depth-local values, never sequence state.

Errors are :class:`ValueError` naming the argument, raised before any work is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from goldens.config import V41Config
from goldens.exact import matmul_fp32, sigmoid_fp32


class HcMixes(NamedTuple):
    """One site's coefficients, all FP32: ``pre [T, hc]``, ``post [T, hc]``,
    ``comb [T, hc, hc]`` indexed ``[t, in_lane, out_lane]``."""

    pre: torch.Tensor
    post: torch.Tensor
    comb: torch.Tensor


@dataclass(frozen=True)
class HcSiteWeights:
    """One site's FP32 parameters: ``fn [mix_hc, hc_dim]``, ``scale [3]``, ``base [mix_hc]``."""

    fn: torch.Tensor
    scale: torch.Tensor
    base: torch.Tensor


# ---- validation ----------------------------------------------------------------------------

def _require_float(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float64, torch.float16):
        raise ValueError(f"{name}: dtype {t.dtype} is not a floating dtype")


def _require_shape(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(t.shape)} must be {tuple(shape)}")


def _require_x_hc(x_hc, cfg: V41Config, name: str = "x_hc") -> int:
    _require_float(x_hc, name)
    hc, d = cfg.hc.hc_mult, cfg.hidden_size
    if x_hc.dim() != 3 or tuple(x_hc.shape[1:]) != (hc, d):
        raise ValueError(f"{name}: shape {tuple(x_hc.shape)} must be [T, {hc}, {d}]")
    return x_hc.shape[0]


# ---- mixes and Sinkhorn --------------------------------------------------------------------

def sinkhorn(logits: torch.Tensor, cfg: V41Config) -> torch.Tensor:
    """Sinkhorn projection of ``[..., hc, hc]`` logits with EXACTLY ``cfg.hc.sinkhorn_iters``
    passes (20 for every preset), all FP32, ``eps = cfg.hc.eps``:

    pass 1: ``M = softmax_row(logits) + eps``; ``M /= colsum(M) + eps``;
    passes 2..n: ``M /= rowsum(M) + eps``; ``M /= colsum(M) + eps``.

    The result ends on a column normalization (columns sum to 1 up to eps; rows approximately
    so).  This is truncation, not convergence: the pass count is part of the math.
    """
    _require_float(logits, "logits")
    hc = cfg.hc.hc_mult
    if logits.dim() < 2 or tuple(logits.shape[-2:]) != (hc, hc):
        raise ValueError(f"logits: shape {tuple(logits.shape)} must end in [{hc}, {hc}]")
    passes, eps = cfg.hc.sinkhorn_iters, cfg.hc.eps
    if passes < 1:
        raise ValueError(f"cfg.hc.sinkhorn_iters: {passes} must be >= 1")
    m = torch.softmax(logits.to(torch.float32), dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(passes - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def hc_mixes(x_hc: torch.Tensor, weights: HcSiteWeights, cfg: V41Config) -> HcMixes:
    """A site's (pre, post, comb) from its input lanes ``x_hc [T, hc, D]``, all FP32.

    ``flat = x_hc.reshape(T, hc*D)`` in FP32; ``mixes = (flat @ fn^T) * rsqrt(mean(flat^2)
    + cfg.rms_norm_eps)`` [``flat @ fn^T``: FP64 accumulation, one rounding to FP32
    (:func:`goldens.exact.matmul_fp32`, so a row's mixes do not depend on its batch); the
    scaling in FP32; one unweighted RMS statistic over the whole ``hc*D`` row]; with ``s = scale``, ``b = base`` and ``hc_eps = cfg.hc.eps``:
    ``pre = sigmoid(mixes[:hc]*s0 + b[:hc]) + hc_eps``,
    ``post = 2*sigmoid(mixes[hc:2hc]*s1 + b[hc:2hc])``,
    ``comb = sinkhorn(reshape(mixes[2hc:]*s2 + b[2hc:], hc, hc))`` (:func:`sinkhorn`).
    The sigmoid is :func:`goldens.exact.sigmoid_fp32` (FP64 evaluation, one rounding to
    FP32): torch's FP32 sigmoid differs in the last bit between its vector body and scalar
    tail, which would make a row's pre/post depend on the batch size.
    """
    t = _require_x_hc(x_hc, cfg)
    hc, mix = cfg.hc.hc_mult, cfg.mix_hc
    for name, ten, shape in (("weights.fn", weights.fn, (mix, cfg.hc_dim)),
                             ("weights.scale", weights.scale, (3,)),
                             ("weights.base", weights.base, (mix,))):
        _require_float(ten, name)
        _require_shape(ten, name, shape)
    flat = x_hc.to(torch.float32).reshape(t, cfg.hc_dim)
    fn = weights.fn.to(torch.float32)
    scale = weights.scale.to(torch.float32)
    base = weights.base.to(torch.float32)
    rstd = torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + cfg.rms_norm_eps)
    mixes = matmul_fp32(flat, fn) * rstd
    pre = sigmoid_fp32(mixes[:, :hc] * scale[0] + base[:hc]) + cfg.hc.eps
    post = 2.0 * sigmoid_fp32(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(t, hc, hc)
    return HcMixes(pre, post, sinkhorn(logits, cfg))


# ---- collapse / expand ---------------------------------------------------------------------

def initial_pre_mix(num_tokens: int, cfg: V41Config) -> torch.Tensor:
    """The pre-mix the very first site collapses with: FP32 ``[T, hc]`` one-hot on lane 0."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens: must be an int >= 0, got {num_tokens!r}")
    mix = torch.zeros(num_tokens, cfg.hc.hc_mult, dtype=torch.float32)
    mix[:, 0] = 1.0
    return mix


def hc_pre(x_hc: torch.Tensor, pre: torch.Tensor, cfg: V41Config) -> torch.Tensor:
    """Collapse ``y = sum_h pre[:, h] * x_hc[:, h]`` -> BF16 ``[T, D]``.

    [FP32 accumulation in ascending lane order: ``acc = pre0*x0; acc += pre1*x1; ...``]
    then one [BF16] cast.  ``pre`` is used as given (not normalized).
    """
    t = _require_x_hc(x_hc, cfg)
    _require_float(pre, "pre")
    _require_shape(pre, "pre", (t, cfg.hc.hc_mult))
    x = x_hc.to(torch.float32)
    p = pre.to(torch.float32)
    acc = p[:, 0:1] * x[:, 0]
    for h in range(1, cfg.hc.hc_mult):
        acc = acc + p[:, h:h + 1] * x[:, h]
    return acc.to(torch.bfloat16)


def hc_post(y: torch.Tensor, x_hc: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
            cfg: V41Config) -> torch.Tensor:
    """Expand: ``out[:, o] = post[:, o]*y + sum_i comb[:, i, o]*x_hc[:, i]``.

    ``y [T, D]`` is the sublayer output (BF16); ``comb`` is ``M[in, out]`` (the reduction
    runs over its FIRST lane axis).  [FP32 accumulation: the post term first, then lanes
    ``i`` ascending] then [BF16] rounding; the result is returned as FP32 ``[T, hc, D]``
    (BF16 values stored FP32, the residual-stream storage format).
    """
    t = _require_x_hc(x_hc, cfg)
    hc, d = cfg.hc.hc_mult, cfg.hidden_size
    _require_float(y, "y")
    _require_shape(y, "y", (t, d))
    _require_float(post, "post")
    _require_shape(post, "post", (t, hc))
    _require_float(comb, "comb")
    _require_shape(comb, "comb", (t, hc, hc))
    x = x_hc.to(torch.float32)
    yf = y.to(torch.float32)
    p = post.to(torch.float32)
    m = comb.to(torch.float32)
    lanes = []
    for o in range(hc):
        acc = p[:, o:o + 1] * yf
        for i in range(hc):
            acc = acc + m[:, i, o:o + 1] * x[:, i]
        lanes.append(acc)
    return torch.stack(lanes, dim=1).to(torch.bfloat16).to(torch.float32)


def hc_head(x_hc: torch.Tensor, last_pre_mix: torch.Tensor, cfg: V41Config) -> torch.Tensor:
    """Final collapse after the last layer: :func:`hc_pre` with the last layer's delayed
    pre-mix (the last FFN site's ``pre``); no learned head parameters.  -> [BF16] ``[T, D]``
    (the final RMSNorm follows, in the boundary golden)."""
    return hc_pre(x_hc, last_pre_mix, cfg)


# ---- staggered sites -----------------------------------------------------------------------

Sublayer = Callable[[torch.Tensor], torch.Tensor]


def hc_site(x_hc: torch.Tensor, incoming_pre: torch.Tensor, weights: HcSiteWeights,
            sublayer: Sublayer, cfg: V41Config) -> tuple[torch.Tensor, torch.Tensor]:
    """One staggered mHC site around ``sublayer`` (BF16 ``[T, D]`` -> ``[T, D]``; it owns its
    input RMSNorm).

    Mixes come from this site's input lanes; the collapse uses ``incoming_pre`` (the
    previous site's ``pre``, or :func:`initial_pre_mix` at the first site); this site's
    ``post``/``comb`` expand immediately.  Returns ``(new x_hc FP32 [T, hc, D] (BF16
    values), this site's pre FP32 [T, hc])`` -- the pre-mix the NEXT site collapses with.
    """
    mixes = hc_mixes(x_hc, weights, cfg)
    y = sublayer(hc_pre(x_hc, incoming_pre, cfg))
    return hc_post(y, x_hc, mixes.post, mixes.comb, cfg), mixes.pre


def hc_block(x_hc: torch.Tensor, incoming_pre: torch.Tensor,
             attn_weights: HcSiteWeights, attention: Sublayer,
             ffn_weights: HcSiteWeights, ffn: Sublayer,
             cfg: V41Config) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder Block's two sites: Attention collapses with ``incoming_pre``, the FFN with the
    Attention site's pre; returns ``(x_hc, FFN pre)``, the next layer's incoming pre-mix."""
    x_hc, attn_pre = hc_site(x_hc, incoming_pre, attn_weights, attention, cfg)
    return hc_site(x_hc, attn_pre, ffn_weights, ffn, cfg)
