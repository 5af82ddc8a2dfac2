"""RoPE golden: YaRN profile, row materialization contract, pair rotation."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens.config import FLASH, TINY
from goldens.rope import (apply_rope_tail, materialize_rope_rows, precompute_rope_tables,
                          rope_frequencies, rotate_pairs, yarn_ramp_bounds)


def test_flash_yarn_ramp_runs_over_indices_15_to_25():
    assert yarn_ramp_bounds(FLASH) == (15, 25)


def test_base_profile_has_no_yarn():
    f = rope_frequencies(FLASH, compressed=False).double()
    expect = torch.tensor([10000.0 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
    torch.testing.assert_close(f, expect, rtol=1e-6, atol=0)


def test_compressed_profile_blends_by_ramp():
    f = rope_frequencies(FLASH, compressed=True).double()
    base = torch.tensor([160000.0 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
    # below the ramp: unscaled; above it: divided by factor 16; inside: linear blend
    torch.testing.assert_close(f[:16], base[:16], rtol=1e-6, atol=0)
    torch.testing.assert_close(f[25:], base[25:] / 16, rtol=1e-6, atol=0)
    ramp = (20 - 15) / (25 - 15)
    assert math.isclose(float(f[20]), float(base[20] / 16 * ramp + base[20] * (1 - ramp)),
                        rel_tol=1e-6)


def test_tables_are_fp32_half_width():
    cos, sin = precompute_rope_tables(TINY, compressed=True, capacity=64)
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.shape == (64, TINY.rope_dim // 2)
    assert torch.equal(cos[0], torch.ones(16)) and torch.equal(sin[0], torch.zeros(16))
    angle = 37 * float(rope_frequencies(TINY, True)[3])
    assert math.isclose(float(cos[37, 3]), math.cos(angle), abs_tol=2e-6)


def _rows(t, half=16, fill=7.0):
    return torch.full((t, half), fill), torch.full((t, half), -fill)


def test_materialize_rows_semantics():
    fc, fs = precompute_rope_tables(TINY, compressed=False, capacity=32)
    pos = torch.tensor([3, -1, 31, 5, 9], dtype=torch.int32)
    rc, rs = _rows(5)
    materialize_rope_rows(fc, fs, pos, 3, rc, rs)
    assert torch.equal(rc[0], fc[3]) and torch.equal(rs[2], fs[31])
    assert torch.equal(rc[1], torch.ones(16)) and torch.equal(rs[1], torch.zeros(16))
    assert torch.equal(rc[3:], torch.full((2, 16), 7.0))  # padding untouched
    assert torch.equal(rs[3:], torch.full((2, 16), -7.0))


def test_zero_tokens_touch_nothing_even_with_bad_positions():
    fc, fs = precompute_rope_tables(TINY, compressed=False, capacity=8)
    rc, rs = _rows(2)
    before = rc.clone(), rs.clone()
    materialize_rope_rows(fc, fs, torch.tensor([100, 100], dtype=torch.int32), 0, rc, rs)
    assert torch.equal(rc, before[0]) and torch.equal(rs, before[1])


def test_position_at_capacity_raises_before_writing():
    fc, fs = precompute_rope_tables(TINY, compressed=False, capacity=8)
    rc, rs = _rows(3)
    before = rc.clone()
    with pytest.raises(ValueError, match=r"position_ids\[2\].*capacity 8"):
        materialize_rope_rows(fc, fs, torch.tensor([1, 2, 8], dtype=torch.int32), 3, rc, rs)
    assert torch.equal(rc, before)
    # a bad position past num_tokens is padding: ignored
    materialize_rope_rows(fc, fs, torch.tensor([1, 2, 8], dtype=torch.int32), 2, rc, rs)


@pytest.mark.parametrize("field,kwargs", [
    ("num_tokens", dict(num_tokens=4)),
    ("num_tokens", dict(num_tokens=-1)),
    ("position_ids", dict(position_ids=torch.zeros(3, dtype=torch.int64))),
    ("rope_cos", dict(rope_cos=torch.zeros(3, 8))),
    ("rope_sin", dict(rope_sin=torch.zeros(3, 16, dtype=torch.float64))),
    ("freqs_cos", dict(freqs_cos=torch.zeros(8, 16, dtype=torch.bfloat16))),
])
def test_bad_arguments_name_the_field(field, kwargs):
    fc, fs = precompute_rope_tables(TINY, compressed=False, capacity=8)
    rc, rs = _rows(3)
    args = dict(freqs_cos=fc, freqs_sin=fs, position_ids=torch.zeros(3, dtype=torch.int32),
                num_tokens=3, rope_cos=rc, rope_sin=rs)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        materialize_rope_rows(**args)


def test_rotation_matches_complex_multiplication():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 32, dtype=torch.float64).float()
    cos, sin = precompute_rope_tables(TINY, compressed=True, capacity=5)
    out = rotate_pairs(x, cos, sin).double()
    z = torch.view_as_complex(x.double().unflatten(-1, (16, 2)).contiguous())
    w = torch.polar(torch.ones(5, 16, dtype=torch.float64), torch.atan2(sin.double(), cos.double()))
    expect = torch.view_as_real(z * w[:, None, :]).flatten(-2)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 9))
def test_inverse_undoes_rotation_and_pair_norms_kept(seed, t):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, 2, 64, generator=g)
    pos = torch.randint(0, 8192, (t,), generator=g)
    cos, sin = precompute_rope_tables(TINY, compressed=True)
    cos, sin = cos[pos], sin[pos]
    y = apply_rope_tail(x, cos, sin)
    assert torch.equal(y[..., :32], x[..., :32])  # NoPE head untouched
    torch.testing.assert_close(apply_rope_tail(y, cos, sin, inverse=True), x, rtol=1e-5, atol=1e-5)
    pn = lambda v: v[..., 32:].unflatten(-1, (16, 2)).norm(dim=-1)
    torch.testing.assert_close(pn(y), pn(x), rtol=1e-5, atol=1e-5)


def test_bf16_input_rounds_once_at_output():
    x = torch.randn(4, 64).bfloat16()
    cos, sin = precompute_rope_tables(TINY, compressed=False, capacity=4)
    y = apply_rope_tail(x, cos, sin)
    assert y.dtype == torch.bfloat16
    expect = rotate_pairs(x[..., 32:].float(), cos, sin).bfloat16()
    assert torch.equal(y[..., 32:], expect)
