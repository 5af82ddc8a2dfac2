"""Acceptance of a SUT's Q-A latent ``qr`` at BF16 rounding ties (decode attention entries).

``qr = BF16(RMSNorm(BF16(MX(x) @ wq_a^T), q_norm))`` has two BF16 rounding boundaries.  The
contract fixes FP32 accumulation but not its order, so where the exact value of an element
lies within FP32 rounding error of the midpoint between two BF16 values, both are correct
results: the golden's ascending group sum takes one side, a kernel's accumulation may take
the other.  Through the row's RMS and the MXFP8 quantizer before ``wq_b`` one such flip moves
every query element of the row, and can take the output row past the per-row bound although
every stage after ``qr`` is exact on its own input (the traced FLASH rows of the README).

The rule, in the spirit of the contract's Top-K acceptance (an accepted selection gets its
output reference recomputed from the reference caches and original weights): a SUT's row of
``qr`` is ACCEPTED when some vector ``L`` of legitimate roundings of the exact projection
makes every element of that row a legitimate rounding of the exact RMSNorm of ``L``.  An
element's legitimate roundings of the projection are the golden's value and every BF16
value nearest to some point within eight typical rounding errors of an FP32 sum of its
``K`` products in an unspecified order (``u*sqrt(K)*||p||``, ``u`` = 2^-24, ``p`` the
element's scaled products: wide where they cancel) of its exact (FP64) value; of the
RMSNorm, the BF16 value nearest the exact one and, within :data:`NORM_WINDOW` of a tie,
both neighbours.  The output reference of the accepted rows is then
recomputed on the SUT's ``qr`` (``attention_paths.output_reference``); the bounds do not
change.  A row no legitimate rounding explains keeps the nominal reference.
"""

from __future__ import annotations

import itertools
import math

import torch

from goldens.quant import MX_GROUP, e8m0_decode, mxfp8_linear, quantize_mxfp8_activation

FP32_U = 2.0 ** -24  # FP32 unit roundoff
SUM_SIGMAS = 8  # tie radius of the projection, in typical FP32 summation errors
NORM_WINDOW = 2.0 ** -16  # tie radius of the RMSNorm output, relative (~256 FP32 roundings)
_PRUNE_WINDOW = 2.0 ** -12  # per-element pre-selection on the golden's RMS (exact check after)
MAX_COMBINATIONS = 4096  # candidate ``L`` vectors tried per row; more: not accepted


def exact_projection(x_row: torch.Tensor, wq_a: torch.Tensor,
                     wq_a_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, radius)`` of one row ``[K]``: FP64 ``MX(x) @ wq_a^T`` (the activation
    quantized as the golden does, group dots and sums in FP64, no BF16 cast) and, per
    element, the distance from a BF16 tie inside which an FP32 sum in another order may
    land on either side: ``SUM_SIGMAS * u * sqrt(K) * ||p||`` over its scaled products."""
    g = MX_GROUP
    xa, codes = quantize_mxfp8_activation(x_row[None], g)
    sa = e8m0_decode(codes).double()[0]
    sw = e8m0_decode(wq_a_scale).double().repeat_interleave(g, 0)
    w64 = wq_a.to(torch.float64)
    n, k = w64.shape
    products = (w64 * xa.to(torch.float64)[0][None, :]).view(n, k // g, g) * (sa[None, :] * sw)[..., None]
    exact = products.sum(-1).sum(-1)
    radius = SUM_SIGMAS * FP32_U * math.sqrt(k) * products.square().sum((-2, -1)).sqrt()
    return exact, radius


def _step(c: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The BF16 value next to ``c`` towards +inf where ``up``, towards -inf elsewhere."""
    bits = c.view(torch.int16).int()
    away = up == (bits >= 0)  # a larger magnitude: +1 on the bit pattern
    return torch.where(away, bits + 1, bits - 1).to(torch.int16).view(torch.bfloat16)


def bf16_bracket(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lo, hi, nearest, tie_distance)`` of FP64 ``v``: the BF16 values below and above it
    (equal when ``v`` is a BF16 value), the nearer of them, and ``|v - (lo+hi)/2|`` (inf
    when ``v`` is a BF16 value)."""
    c = v.to(torch.bfloat16)
    cd = c.double()
    lo = torch.where(cd <= v, c, _step(c, torch.zeros_like(v, dtype=torch.bool)))
    hi = torch.where(cd >= v, c, _step(c, torch.ones_like(v, dtype=torch.bool)))
    lo_d, hi_d = lo.double(), hi.double()
    nearest = torch.where((v - lo_d).abs() <= (hi_d - v).abs(), lo, hi)
    tie = (v - (lo_d + hi_d) / 2).abs()
    return lo, hi, nearest, torch.where(lo_d == hi_d, torch.full_like(v, torch.inf), tie)


def legitimate(value: torch.Tensor, exact: torch.Tensor, radius) -> torch.Tensor:
    """Per element: is BF16 ``value`` a correct rounding of FP64 ``exact`` (the nearest BF16
    value, or either neighbour when ``exact`` lies within ``radius`` of their midpoint)?"""
    lo, hi, nearest, tie = bf16_bracket(exact)
    v = value.view(torch.int16)
    return (v == nearest.view(torch.int16)) | ((tie <= radius) & ((v == lo.view(torch.int16)) |
                                                                  (v == hi.view(torch.int16))))


def _between(a: torch.Tensor, b: torch.Tensor, limit: int = 64) -> list[float]:
    """The BF16 values from ``a`` up to ``b`` (0-d), at most ``limit`` of them."""
    out, v = [], a.reshape(1)
    up = torch.ones(1, dtype=torch.bool)
    while float(v) <= float(b) and len(out) < limit:
        out.append(float(v))
        v = _step(v, up)
    return out


def _preimage(qr: torch.Tensor, factor: float, low: torch.Tensor, high: torch.Tensor) -> list[float]:
    """The BF16 values in ``[low, high]`` that ``factor`` (the row's RMS scale times the norm
    weight) maps into the rounding cell of BF16 ``qr``, widened by the pre-selection window."""
    v = qr.reshape(1)
    below, above = _step(v, torch.zeros(1, dtype=torch.bool)), _step(v, torch.ones(1, dtype=torch.bool))
    q = float(v)
    widen = _PRUNE_WINDOW * abs(q)
    ends = sorted([((q + float(below)) / 2 - widen) / factor, ((q + float(above)) / 2 + widen) / factor])
    first = bf16_bracket(torch.tensor([ends[0]], dtype=torch.float64))[1]  # smallest BF16 >= start
    last = bf16_bracket(torch.tensor([ends[1]], dtype=torch.float64))[0]  # largest BF16 <= end
    start = first if float(first) >= float(low) else low.reshape(1)
    stop = last if float(last) <= float(high) else high.reshape(1)
    return _between(start, stop)


def _normalized(lin: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Exact (FP64) RMSNorm of BF16 rows ``lin``."""
    x = lin.double()
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight.double()


def accept_row(x_row: torch.Tensor, qkv, eps: float, sut_qr: torch.Tensor) -> bool:
    """Whether the SUT's ``qr`` row is a legitimate rounding of the row's ``q_lora`` (see
    the module doc).  ``x_row`` BF16 ``[hidden]`` is the golden's input row."""
    exact, radius = exact_projection(x_row, qkv.wq_a, qkv.wq_a_scale)
    golden = mxfp8_linear(x_row[None], qkv.wq_a, qkv.wq_a_scale)[0]
    nearest = bf16_bracket(exact)[2]
    low, high = bf16_bracket(exact - radius)[2], bf16_bracket(exact + radius)[2]
    free = ((low.view(torch.int16) != high.view(torch.int16)) |
            (golden.view(torch.int16) != nearest.view(torch.int16))).nonzero().flatten()
    g64 = golden.double()
    s0 = float(1.0 / torch.sqrt(g64.square().mean() + eps))  # the golden's RMS: pre-selection only
    options = []
    for j in free.tolist():
        f = s0 * float(qkv.q_norm[j])
        if f == 0.0:
            return False
        values = _preimage(sut_qr[j], f, low[j], high[j])
        if golden[j].item() not in values:
            values.append(golden[j].item())
        approx = torch.tensor(values, dtype=torch.float64) * f
        keep = legitimate(sut_qr[j].expand(approx.shape), approx, _PRUNE_WINDOW * approx.abs())
        kept = [val for val, ok in zip(values, keep.tolist()) if ok]
        if not kept:
            return False
        target = float(sut_qr[j])  # the closest first: the greedy candidate below
        options.append(sorted(kept, key=lambda val: abs(val * f - target)))

    def explains(combo) -> bool:
        lin = nearest.clone()
        if combo:
            lin[free] = torch.tensor(combo, dtype=torch.bfloat16)
        y = _normalized(lin[None], qkv.q_norm, eps)[0]
        return bool(legitimate(sut_qr, y, NORM_WINDOW * y.abs()).all())

    if explains([o[0] for o in options]):
        return True
    if math.prod(len(o) for o in options) > MAX_COMBINATIONS:
        return False
    return any(explains(combo) for combo in itertools.product(*options))


def accepted_rows(x: torch.Tensor, qkv, eps: float, sut_qr: torch.Tensor, golden_qr: torch.Tensor,
                  active: int) -> list[int]:
    """The active rows where the SUT's ``qr`` ``[T, q_lora]`` differs from the golden's and is
    accepted by :func:`accept_row` (rows of one rank)."""
    differ = (sut_qr[:active].view(torch.int16) != golden_qr[:active].view(torch.int16)).any(-1)
    return [t for t in differ.nonzero().flatten().tolist() if accept_row(x[t], qkv, eps, sut_qr[t])]
