"""Acceptance of a SUT's Q-A latent ``qr`` at BF16 rounding ties (decode attention entries).

``qr = BF16(RMSNorm(BF16(MX(x) @ wq_a^T), q_norm))`` has two BF16 rounding boundaries.  The
contract fixes FP32 accumulation but not its order, so where the exact value of an element
lies within a few FP32 roundings of the midpoint between two BF16 values, both are correct
results: the golden's ascending group sum takes one side, a kernel's accumulation may take
the other.  Through the row's RMS and the MXFP8 quantizer before ``wq_b`` one such flip moves
every query element of the row, and can take the output row past the per-row bound although
every stage after ``qr`` is exact on its own input (the traced FLASH rows of the README).

The rule, in the spirit of the contract's Top-K acceptance (an accepted selection gets its
output reference recomputed from the reference caches and original weights): a SUT's row of
``qr`` is ACCEPTED when some vector ``L`` of legitimate roundings of the exact projection
makes every element of that row a legitimate rounding of the exact RMSNorm of ``L``.  An
element's legitimate roundings are the BF16 value nearest its exact (FP64) value and the
golden's value, plus, when the exact value lies within :data:`TIE_WINDOW` (relative) of the
midpoint between its two BF16 neighbours, both neighbours.  The output reference of the
accepted rows is then recomputed on the SUT's ``qr`` (``attention_paths.output_reference``);
the bounds do not change.  A row no legitimate rounding explains keeps the nominal reference.
"""

from __future__ import annotations

import itertools

import torch

from goldens.quant import MX_GROUP, e8m0_decode, mxfp8_linear, quantize_mxfp8_activation

# relative distance from a BF16 tie inside which either neighbour is a correct rounding:
# ~128 FP32 roundings of the value; the traced FLASH ties were 6.1e-8 .. 3.9e-7
TIE_WINDOW = 2.0 ** -16
_PRUNE_WINDOW = 2.0 ** -12  # per-element pre-selection on the golden's RMS (exact check after)
MAX_COMBINATIONS = 4096  # candidate ``L`` vectors tried per row; more: not accepted


def exact_projection(x_row: torch.Tensor, wq_a: torch.Tensor, wq_a_scale: torch.Tensor) -> torch.Tensor:
    """FP64 ``MX(x) @ wq_a^T`` of one row ``[K]``: the activation quantized as the golden
    does, group dots and group sums in FP64 (exact up to FP64 rounding), no BF16 cast."""
    g = MX_GROUP
    xa, codes = quantize_mxfp8_activation(x_row[None], g)
    sa = e8m0_decode(codes).double()[0]
    sw = e8m0_decode(wq_a_scale).double().repeat_interleave(g, 0)
    w64 = wq_a.to(torch.float64)
    n, k = w64.shape
    dots = (w64 * xa.to(torch.float64)[0][None, :]).view(n, k // g, g).sum(-1)
    return (dots * sa[None, :] * sw).sum(-1)


def _step(c: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The BF16 value next to ``c`` towards +inf where ``up``, towards -inf elsewhere."""
    bits = c.view(torch.int16).int()
    away = up == (bits >= 0)  # a larger magnitude: +1 on the bit pattern
    return torch.where(away, bits + 1, bits - 1).to(torch.int16).view(torch.bfloat16)


def bf16_bracket(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(lo, hi, nearest, tie_distance)`` of FP64 ``v``: the BF16 values below and above it
    (equal when ``v`` is a BF16 value), the nearer of them, and ``|v - (lo+hi)/2| / |v|``."""
    c = v.to(torch.bfloat16)
    cd = c.double()
    lo = torch.where(cd <= v, c, _step(c, torch.zeros_like(v, dtype=torch.bool)))
    hi = torch.where(cd >= v, c, _step(c, torch.ones_like(v, dtype=torch.bool)))
    lo_d, hi_d = lo.double(), hi.double()
    nearest = torch.where((v - lo_d).abs() <= (hi_d - v).abs(), lo, hi)
    tie = (v - (lo_d + hi_d) / 2).abs() / v.abs().clamp_min(1e-300)
    return lo, hi, nearest, torch.where(lo_d == hi_d, torch.full_like(v, torch.inf), tie)


def legitimate(value: torch.Tensor, exact: torch.Tensor, window: float = TIE_WINDOW) -> torch.Tensor:
    """Per element: is BF16 ``value`` a correct rounding of FP64 ``exact`` (the nearest BF16
    value, or either neighbour within ``window`` of a tie)?"""
    lo, hi, nearest, tie = bf16_bracket(exact)
    v = value.view(torch.int16)
    return (v == nearest.view(torch.int16)) | ((tie <= window) & ((v == lo.view(torch.int16)) |
                                                                  (v == hi.view(torch.int16))))


def _normalized(lin: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Exact (FP64) RMSNorm of BF16 rows ``lin``."""
    x = lin.double()
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight.double()


def accept_row(x_row: torch.Tensor, qkv, eps: float, sut_qr: torch.Tensor) -> bool:
    """Whether the SUT's ``qr`` row is a legitimate rounding of the row's ``q_lora`` (see
    the module doc).  ``x_row`` BF16 ``[hidden]`` is the golden's input row."""
    exact = exact_projection(x_row, qkv.wq_a, qkv.wq_a_scale)
    golden = mxfp8_linear(x_row[None], qkv.wq_a, qkv.wq_a_scale)[0]
    lo, hi, nearest, tie = bf16_bracket(exact)
    free = ((tie <= TIE_WINDOW) | (golden.view(torch.int16) != nearest.view(torch.int16))).nonzero().flatten()
    g64 = golden.double()
    s0 = float(1.0 / torch.sqrt(g64.square().mean() + eps))  # the golden's RMS: pre-selection only
    options = []
    for j in free.tolist():
        values = {nearest[j].item(), golden[j].item()}
        if tie[j] <= TIE_WINDOW:
            values |= {lo[j].item(), hi[j].item()}
        values = sorted(values)
        approx = torch.tensor(values, dtype=torch.float64) * (s0 * float(qkv.q_norm[j]))
        keep = legitimate(sut_qr[j].expand(approx.shape), approx, _PRUNE_WINDOW)
        kept = [val for val, ok in zip(values, keep.tolist()) if ok]
        if not kept:
            return False
        options.append(kept)
    if torch.tensor([len(o) for o in options], dtype=torch.float64).prod() > MAX_COMBINATIONS:
        return False
    base = nearest.clone()
    for combo in itertools.product(*options):
        lin = base.clone()
        if combo:
            lin[free] = torch.tensor(combo, dtype=torch.bfloat16)
        if bool(legitimate(sut_qr, _normalized(lin[None], qkv.q_norm, eps)[0]).all()):
            return True
    return False


def accepted_rows(x: torch.Tensor, qkv, eps: float, sut_qr: torch.Tensor, golden_qr: torch.Tensor,
                  active: int) -> list[int]:
    """The active rows where the SUT's ``qr`` ``[T, q_lora]`` differs from the golden's and is
    accepted by :func:`accept_row` (rows of one rank)."""
    differ = (sut_qr[:active].view(torch.int16) != golden_qr[:active].view(torch.int16)).any(-1)
    return [t for t in differ.nonzero().flatten().tolist() if accept_row(x[t], qkv, eps, sut_qr[t])]
