"""The Q-A latent acceptance rule (``harness.entries.qr_rounding``) on a projection built to
hold an exact BF16 tie: the other rounding of the tie is accepted, anything else is not."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from goldens.qkv import rms_norm_bf16
from goldens.quant import mxfp8_linear
from harness.entries import qr_rounding

EPS = 1e-6
N, K = 64, 64


def _weights() -> SimpleNamespace:
    """Row 0 of ``MX(ones) @ wq_a^T`` is exactly 1 + 2^-8, the midpoint between the BF16
    values 1 and 1 + 2^-7; the other rows are random E4M3 dots."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(N, K, generator=gen) * 0.5).to(torch.float8_e4m3fn)
    w[0] = 0.0
    w[0, 0], w[0, 1] = 1.0, 2.0 ** -8
    w[1] = 0.0
    w[1, 0], w[1, 1], w[1, 2] = 1.0, -1.0, 2.0 ** -9  # cancels down to 2^-9
    scale = torch.full((N // 32, K // 32), 127, dtype=torch.uint8)  # E8M0 2^0
    q_norm = 1.0 + 0.1 * torch.randn(N, generator=gen)
    return SimpleNamespace(wq_a=w, wq_a_scale=scale, q_norm=q_norm)


def _x() -> torch.Tensor:
    return torch.ones(K, dtype=torch.bfloat16)


def _linear(w) -> torch.Tensor:
    return mxfp8_linear(_x()[None], w.wq_a, w.wq_a_scale)[0]


def test_the_projection_holds_an_exact_tie():
    w = _weights()
    exact, radius = qr_rounding.exact_projection(_x(), w.wq_a, w.wq_a_scale)
    assert float(exact[0]) == 1.0 + 2.0 ** -8
    lo, hi, nearest, tie = qr_rounding.bf16_bracket(exact)
    assert (float(lo[0]), float(hi[0]), float(tie[0])) == (1.0, 1.0 + 2.0 ** -7, 0.0)
    assert 0 < float(radius[0]) < 2.0 ** -16
    assert float(_linear(w)[0]) == 1.0  # the golden rounds the tie to even


def test_the_tie_radius_follows_the_products_not_the_sum():
    """Where the products cancel, FP32 rounding error is large beside the sum: the radius
    scales with the products' norm, so in relative terms it is far wider there."""
    w = _weights()
    exact, radius = qr_rounding.exact_projection(_x(), w.wq_a, w.wq_a_scale)
    assert float(exact[1]) == 2.0 ** -9
    assert float(radius[1] / exact[1].abs()) > 100 * float(radius[0] / exact[0].abs())


def test_the_golden_latent_and_the_other_side_of_the_tie_are_accepted():
    w = _weights()
    lin = _linear(w)
    assert qr_rounding.accept_row(_x(), w, EPS, rms_norm_bf16(lin[None], w.q_norm, EPS)[0])
    flipped = lin.clone()
    flipped[0] = 1.0 + 2.0 ** -7
    other = rms_norm_bf16(flipped[None], w.q_norm, EPS)[0]
    assert not torch.equal(other, rms_norm_bf16(lin[None], w.q_norm, EPS)[0])
    assert qr_rounding.accept_row(_x(), w, EPS, other)


def test_a_flip_away_from_a_tie_or_a_wrong_element_is_not_accepted():
    w = _weights()
    lin = _linear(w)
    exact, radius = qr_rounding.exact_projection(_x(), w.wq_a, w.wq_a_scale)
    _, _, _, tie = qr_rounding.bf16_bracket(exact)
    margin = torch.nan_to_num(tie[1:] / radius[1:], posinf=0)
    j = int(margin.argmax()) + 1  # the element farthest from a tie, in tie radii
    assert tie[j] > radius[j]
    flipped = lin.clone()
    flipped[j] = torch.nextafter(lin[j].float(), torch.tensor(float("inf"))).to(torch.bfloat16)
    if flipped[j] == lin[j]:  # FP32 nextafter stays inside the BF16 value: step the bits
        flipped[j] = (lin[j:j + 1].view(torch.int16) + 1).view(torch.bfloat16)[0]
    assert not qr_rounding.accept_row(_x(), w, EPS, rms_norm_bf16(flipped[None], w.q_norm, EPS)[0])
    wrong = rms_norm_bf16(lin[None], w.q_norm, EPS)[0].clone()
    wrong[5] *= 2
    assert not qr_rounding.accept_row(_x(), w, EPS, wrong)
    one_ulp = rms_norm_bf16(lin[None], w.q_norm, EPS)[0].clone()  # one ulp off, nowhere near a tie
    one_ulp[j] = (one_ulp[j:j + 1].view(torch.int16) + 1).view(torch.bfloat16)[0]
    assert not qr_rounding.accept_row(_x(), w, EPS, one_ulp)


def test_accepted_rows_lists_only_differing_accepted_rows():
    w = _weights()
    x = torch.stack([_x(), _x(), _x()])
    config = SimpleNamespace(rms_norm_eps=EPS)
    golden = rms_norm_bf16(mxfp8_linear(x, w.wq_a, w.wq_a_scale), w.q_norm, EPS)
    sut = golden.clone()
    flipped = _linear(w).clone()
    flipped[0] = 1.0 + 2.0 ** -7
    sut[1] = rms_norm_bf16(flipped[None], w.q_norm, EPS)[0]  # the other side of the tie
    sut[2, 7] *= 2  # not a rounding
    assert qr_rounding.accepted_rows(x, w, config.rms_norm_eps, sut, golden, 3) == [1]
    assert qr_rounding.accepted_rows(x, w, config.rms_norm_eps, sut, golden, 1) == []

