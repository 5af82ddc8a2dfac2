"""Quantization golden: E2M1 / E4M3 / E8M0 arithmetic, cache formats, weights, MXFP8 linear.

Expected values come from the format definitions (bit layouts, exact Fraction arithmetic,
brute-force nearest-even searches written here), never from running the code under test.
"""

import bisect
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from goldens import quant as q
from goldens.config import FLASH, TINY

SETTINGS = settings(max_examples=60, deadline=None)


# ---- independent format definitions ---------------------------------------------------------

def e2m1_value(code: int) -> float:
    """E2M1 from its bits: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    sign = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return math.copysign(mag, sign)


def e4m3_value(code: int) -> float:
    """E4M3 (fn) magnitude from bits 0-6: exponent bits 6-3 (bias 7), mantissa bits 2-0."""
    e, m = code >> 3, code & 7
    return m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_GRID = [e4m3_value(c) for c in range(127)]  # 127 = NaN


def nearest_even(v: float, grid: list[float]) -> int:
    """Index into an ascending non-negative grid nearest to |v|; ties to the even index
    (for E2M1 and E4M3 the index is the code, so an even index is an even mantissa)."""
    mag = Fraction(abs(v))
    i = bisect.bisect_left(grid, abs(v))
    cands = [c for c in (i - 1, i) if 0 <= c < len(grid)]
    return min(cands, key=lambda c: (abs(Fraction(grid[c]) - mag), c % 2))


def ref_fp4(v: float) -> int:
    mag = min(abs(v), 6.0)
    code = nearest_even(mag, [e2m1_value(c) for c in range(8)])
    return code | (8 if math.copysign(1.0, v) < 0 else 0)


def ref_e4m3(v: float) -> float:
    return E4M3_GRID[nearest_even(v, E4M3_GRID)]


def ref_ceil_log2(v: float | Fraction) -> int:
    """ceil(log2 v) by exact rational arithmetic, clamped to [-127, 127]; v = 0 -> -127."""
    if v == 0:
        return -127
    f = Fraction(v)
    e = f.numerator.bit_length() - f.denominator.bit_length()
    while Fraction(2) ** e < f:
        e += 1
    while Fraction(2) ** (e - 1) >= f:
        e -= 1
    return max(-127, min(127, e))


def f32(v: float) -> float:
    return float(np.float32(v))


def f32_div(a: float, b: float) -> float:
    """IEEE FP32 a / b (correctly rounded; numpy float32 division)."""
    return float(np.float32(a) / np.float32(b))


def is_pow2(v: float) -> bool:
    return v > 0 and math.frexp(v)[0] == 0.5


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def wide_range_groups(seed: int, rows: int, groups: int, group: int) -> torch.Tensor:
    """Random normal data, each group scaled by 2^U(-40, 40) with some zero and tiny groups."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, groups, group, generator=g, dtype=torch.float64)
    exps = torch.randint(-40, 41, (rows, groups, 1), generator=g).double()
    x = x * torch.pow(2.0, exps)
    x[0, 0] = 0.0
    if groups > 1:
        x[0, 1] *= 2.0 ** -120  # drives amax/448 below 2^-127 (the scale floor)
    return x.float().reshape(rows, groups * group)


# ---- FP4 E2M1 -------------------------------------------------------------------------------

def test_fp4_table_matches_bit_layout():
    assert [e2m1_value(c) for c in range(8)] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    got = q.fp4_decode(torch.arange(16, dtype=torch.uint8))
    assert got.dtype == torch.float32
    assert got.tolist() == [e2m1_value(c) for c in range(16)]
    assert torch.signbit(got[8]) and not torch.signbit(got[0])


def test_all_16_codes_round_trip():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(q.fp4_encode(q.fp4_decode(codes)), codes)


# (value, code): RNE on the E2M1 grid; positive ties at 0.25/1.25/2.5/5.0 go down.
TIES = [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)]


@pytest.mark.parametrize("value,code", TIES + [(-v, c | 8) for v, c in TIES])
def test_tie_points_go_to_even_code(value, code):
    assert int(q.fp4_encode(torch.tensor([value]))[0]) == code


def test_signed_zero_saturation_and_inf():
    x = torch.tensor([0.0, -0.0, -0.1, 6.0, 6.5, 100.0, -100.0, math.inf, -math.inf])
    assert q.fp4_encode(x).tolist() == [0, 8, 8, 7, 7, 7, 15, 7, 15]


def _near_ties():
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]
    return st.sampled_from(mids).flatmap(lambda m: st.sampled_from([
        m, f32(np.nextafter(np.float32(m), np.float32(0))),
        f32(np.nextafter(np.float32(m), np.float32(10))), -m]))


@SETTINGS
@given(st.lists(st.floats(-9, 9, width=32) | _near_ties(), min_size=1, max_size=64))
def test_fp4_encode_is_nearest_with_ties_to_even(values):
    got = q.fp4_encode(torch.tensor(values, dtype=torch.float32)).tolist()
    assert got == [ref_fp4(v) for v in values]


def test_fp4_encode_float64_uses_full_precision():
    # 0.25 + 2^-40 is above the tie: must round up to 0.5 (a float32 detour would not).
    x = torch.tensor([0.25 + 2.0 ** -40, 2.5 + 2.0 ** -40], dtype=torch.float64)
    assert q.fp4_encode(x).tolist() == [1, 5]


# ---- packing --------------------------------------------------------------------------------

def test_pack_order_low_nibble_first():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=torch.uint8)
    packed = q.pack_fp4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]
    assert torch.equal(q.unpack_fp4(packed), codes)


@SETTINGS
@given(st.lists(st.integers(0, 15), min_size=1, max_size=32).map(lambda v: v + v[: len(v) % 2]))
def test_pack_unpack_round_trip(values):
    codes = torch.tensor(values, dtype=torch.uint8)
    packed = q.pack_fp4(codes)
    expect = [values[2 * i] + 16 * values[2 * i + 1] for i in range(len(values) // 2)]
    assert packed.tolist() == expect
    assert torch.equal(q.unpack_fp4(packed), codes)


# ---- E8M0 and ceil_pow2 ---------------------------------------------------------------------

def test_all_256_e8m0_codes():
    got = q.e8m0_decode(torch.arange(256, dtype=torch.uint8))
    assert got.dtype == torch.float32
    for c in range(255):
        assert float(got[c]) == math.ldexp(1.0, c - 127), c
    assert math.isnan(float(got[255]))
    back = q.e8m0_encode(got[:255])
    assert back.dtype == torch.uint8 and back.tolist() == list(range(255))


@pytest.mark.parametrize("bad", [3.0, 0.0, -2.0, 2.0 ** 128, 2.0 ** -128, math.inf, math.nan])
def test_e8m0_encode_rejects_non_powers(bad):
    with pytest.raises(ValueError, match="scale"):
        q.e8m0_encode(torch.tensor([1.0, bad], dtype=torch.float64))


def _ulp_neighbours():
    out = []
    for e in range(-149, 128):
        p = np.float32(math.ldexp(1.0, e))
        up, down = np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(0))
        out += [float(p), f32(up), f32(down)]
    return out


def test_ceil_pow2_powers_ulps_and_subnormals():
    vals = _ulp_neighbours() + [f32(v) for v in (0.0, 1e-45, 3e-45, 2.0 ** -127 * 1.5, 448.00003)]
    got = q.ceil_pow2(torch.tensor(vals, dtype=torch.float32))
    assert got.dtype == torch.float32
    assert got.tolist() == [math.ldexp(1.0, ref_ceil_log2(v)) for v in vals]


@SETTINGS
@given(st.lists(st.floats(min_value=0, width=32, allow_infinity=False, allow_nan=False,
                          allow_subnormal=True), min_size=1, max_size=64))
def test_ceil_pow2_random_float32(values):
    got = q.ceil_pow2(torch.tensor(values, dtype=torch.float32)).tolist()
    assert got == [math.ldexp(1.0, ref_ceil_log2(v)) for v in values]


@SETTINGS
@given(st.lists(st.floats(0, 1e300, allow_subnormal=True), min_size=1, max_size=64))
def test_ceil_log2_random_float64(values):
    got = q.ceil_log2(torch.tensor(values, dtype=torch.float64)).tolist()
    assert got == [ref_ceil_log2(v) for v in values]


def test_ceil_pow2_one_ulp_above_in_float64():
    x = torch.tensor([1.0 + 2.0 ** -52, 2.0 ** -1074], dtype=torch.float64)
    assert q.ceil_log2(x).tolist() == [1, -127]


# ---- MXFP8 ----------------------------------------------------------------------------------

def _check_mxfp8(x: torch.Tensor, payload, codes, group: int, amax_floor: float | None):
    d = x.shape[-1]
    assert payload.dtype == torch.float8_e4m3fn and payload.shape == x.shape
    assert codes.dtype == torch.uint8 and codes.shape == (*x.shape[:-1], d // group)
    xg = x.double().reshape(*x.shape[:-1], d // group, group)
    scale = torch.tensor([math.ldexp(1.0, c - 127) for c in codes.flatten().tolist()],
                         dtype=torch.float64).reshape(codes.shape)
    amax = xg.abs().amax(-1)
    if amax_floor is not None:
        amax = amax.clamp_min(f32(amax_floor))
    # scale is the smallest power of two (>= 2^-127) with amax / scale <= 448
    for a, s in zip(amax.flatten().tolist(), scale.flatten().tolist()):
        assert is_pow2(s)
        assert a <= 448 * s
        assert a > 224 * s or s == 2.0 ** -127
    v = xg / scale[..., None]
    assert bool((v.abs() <= 448).all())  # never clips
    # per-element error <= half an E4M3 ULP at v's binade (subnormal ULP 2^-9), times scale
    binade = torch.frexp(v).exponent.double() - 1
    half_ulp = torch.pow(2.0, binade.clamp_min(-6) - 4)
    got = payload.double().reshape(v.shape)
    assert bool(((got - v).abs() <= half_ulp).all())
    torch.testing.assert_close(q.dequantize_mxfp8(payload, codes, group).double(),
                               got.mul(scale[..., None]).reshape(x.shape), rtol=0, atol=0)


@SETTINGS
@given(st.integers(0, 2 ** 31), st.sampled_from([16, 32]))
def test_mxfp8_scale_and_error_bound(seed, group):
    x = wide_range_groups(seed, 3, 4, group)
    payload, codes = q.quantize_mxfp8(x, group)
    _check_mxfp8(x, payload, codes, group, amax_floor=None)


def test_mxfp8_relative_l2_of_normal_data():
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(1))
    err = rel_l2(q.dequantize_mxfp8(*q.quantize_mxfp8(x)), x)
    # E4M3 has 3 mantissa bits: RNE error is at most 2^-4 relative; observed ~0.0266
    print(f"MXFP8 g32 relative L2 = {err:.4f}")
    assert err < 0.03


def test_zeros_round_trip_exactly():
    z = torch.zeros(2, 64)
    assert torch.equal(q.dequantize_mxfp8(*q.quantize_mxfp8(z)), z)
    assert torch.equal(q.dequantize_window_kv(*q.quantize_window_kv(z)), z)
    assert torch.equal(q.dequantize_compressed_kv(*q.quantize_compressed_kv(z)), z)
    assert torch.equal(q.dequantize_index_key(*q.quantize_index_key(z)), z)
    a, sa = q.quantize_mxfp8_activation(z)
    assert torch.equal(q.dequantize_mxfp8(a, sa), z)
    zw = torch.zeros(32, 64)
    assert torch.equal(q.dequantize_fp8_weight(*q.quantize_fp8_weight(zw)), zw)
    assert torch.equal(q.dequantize_fp4_expert_weight(*q.quantize_fp4_expert_weight(zw)), zw)


def test_bf16_input_quantizes_its_fp32_value():
    x = torch.randn(4, 64).bfloat16()
    p1, s1 = q.quantize_mxfp8(x)
    p2, s2 = q.quantize_mxfp8(x.float())
    assert torch.equal(p1.view(torch.uint8), p2.view(torch.uint8)) and torch.equal(s1, s2)


# ---- activation MXFP8 -----------------------------------------------------------------------

def test_activation_floor_on_zero_and_tiny_rows():
    x = torch.zeros(2, 64)
    x[1, :32] = 1e-6  # amax 1e-6 < 1e-4: floored
    payload, codes = q.quantize_mxfp8_activation(x)
    floor_code = ref_ceil_log2(Fraction(f32(1e-4)) / 448) + 127
    assert floor_code == -22 + 127
    assert codes.tolist() == [[floor_code] * 2, [floor_code] * 2]
    assert torch.equal(payload[0].float(), torch.zeros(64))
    assert float(payload[1, 0].float()) == ref_e4m3(f32(1e-6) / 2.0 ** -22)


@SETTINGS
@given(st.integers(-100, 100), st.integers(0, 31))
def test_activation_one_ulp_above_power_rounds_up(k, pos):
    exact = np.float32(448.0 * 2.0 ** k)
    above = np.nextafter(exact, np.float32(np.inf))
    x = torch.zeros(2, 32)
    x[0, pos], x[1, pos] = float(exact), -float(above)
    payload, codes = q.quantize_mxfp8_activation(x)
    floor = Fraction(f32(1e-4))
    expect_exact = ref_ceil_log2(max(Fraction(float(exact)), floor) / 448)
    expect_above = ref_ceil_log2(max(Fraction(float(above)), floor) / 448)
    assert codes[:, 0].tolist() == [expect_exact + 127, expect_above + 127]
    if float(exact) > f32(1e-4):
        assert int(codes[1, 0]) == int(codes[0, 0]) + 1
    assert float(payload[0, pos].float()) == ref_e4m3(float(exact) / math.ldexp(1.0, expect_exact))


@SETTINGS
@given(st.integers(0, 2 ** 31))
def test_activation_scale_and_error_bound(seed):
    x = wide_range_groups(seed, 4, 3, 32)
    payload, codes = q.quantize_mxfp8_activation(x)
    _check_mxfp8(x, payload, codes, 32, amax_floor=1e-4)


# ---- MXFP4 ----------------------------------------------------------------------------------

def _mxfp4_reference(x: torch.Tensor, group: int, scale_format: str):
    """Per-group scales and E2M1 codes from the format rules, element by element."""
    rows = x.float().reshape(-1, group).tolist()
    scales, codes = [], []
    for row in rows:
        amax = max(abs(v) for v in row)
        if scale_format == "e8m0":
            s = math.ldexp(1.0, ref_ceil_log2(max(Fraction(amax) / 6, Fraction(2) ** -9)))
        else:
            s = ref_e4m3(min(max(f32_div(amax, 6.0), 2.0 ** -9), 448.0))
        codes += [ref_fp4(max(-6.0, min(6.0, f32_div(v, s)))) for v in row]
        scales.append(s)
    return scales, codes


@SETTINGS
@given(st.integers(0, 2 ** 31),
       st.sampled_from([(16, "e4m3"), (32, "e8m0"), (16, "e8m0"), (32, "e4m3")]))
def test_mxfp4_matches_format_rules(seed, fmt):
    group, scale_format = fmt
    x = wide_range_groups(seed, 2, 3, group)
    packed, scales = q.quantize_mxfp4(x, group, scale_format)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 3 * group // 2)
    want_dtype = torch.uint8 if scale_format == "e8m0" else torch.float8_e4m3fn
    assert scales.dtype == want_dtype and scales.shape == (2, 3)
    ref_scales, ref_codes = _mxfp4_reference(x, group, scale_format)
    got_scales = (q.e8m0_decode(scales) if scale_format == "e8m0" else scales.float()).flatten()
    assert got_scales.tolist() == ref_scales
    assert all(s >= 2.0 ** -9 for s in ref_scales)  # never a zero scale
    assert q.unpack_fp4(packed).flatten().tolist() == ref_codes
    deq = q.dequantize_mxfp4(packed, scales, group, scale_format)
    want = [e2m1_value(c) * ref_scales[i // group] for i, c in enumerate(ref_codes)]
    assert deq.flatten().tolist() == want


def test_mxfp4_e8m0_never_clips():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3)) * 10
    _, scales = q.quantize_index_key(x)
    s = q.e8m0_decode(scales).double()
    amax = x.double().reshape(64, 4, 32).abs().amax(-1)
    assert bool((amax <= 6 * s).all()) and bool(((amax > 3 * s) | (s == 2.0 ** -9)).all())


def test_e4m3_scaled_mxfp4_uses_non_power_of_two_scales():
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(4))
    _, scales = q.quantize_compressed_kv(x)
    vals = scales.float().flatten().tolist()
    non_pow2 = sum(not is_pow2(v) for v in vals)
    assert non_pow2 > len(vals) // 2


def test_mxfp4_relative_l2_of_normal_data():
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(2))
    ckv = rel_l2(q.dequantize_compressed_kv(*q.quantize_compressed_kv(x)), x)
    idx = rel_l2(q.dequantize_index_key(*q.quantize_index_key(x)), x)
    # E2M1 has 1 mantissa bit (RNE error up to 1/4 relative in a binade); observed ~0.095
    # (E4M3 g16) and ~0.116 (E8M0 g32): power-of-two ceil scales leave the top code unused
    # more often than the E4M3 scale does.
    print(f"MXFP4 relative L2: compressed_kv (g16 e4m3) = {ckv:.4f}, "
          f"index_key (g32 e8m0) = {idx:.4f}")
    assert ckv < 0.1
    assert idx < 0.125
    assert ckv < idx


# ---- named caches and ABI -------------------------------------------------------------------

def test_cache_abi_flash_contract():
    assert q.cache_abi(FLASH, 3) == {
        "window_kv": ((3, 128, 1, 512), torch.float8_e4m3fn),
        "window_kv_scale": ((3, 128, 1, 16), torch.uint8),
        "compressed_kv": ((3, 128, 1, 256), torch.uint8),
        "compressed_kv_scale": ((3, 128, 1, 32), torch.float8_e4m3fn),
        "index_key": ((3, 128, 1, 64), torch.uint8),
        "index_key_scale": ((3, 128, 1, 4), torch.uint8),
    }
    assert q.state_cache_abi(FLASH, 5) == ((5, 4, 1024), torch.float32)


def test_cache_abi_tiny_follows_config():
    abi = q.cache_abi(TINY, 2)
    assert abi["window_kv"] == ((2, 16, 1, 64), torch.float8_e4m3fn)
    assert abi["compressed_kv_scale"] == ((2, 16, 1, 4), torch.float8_e4m3fn)
    assert abi["index_key"] == ((2, 16, 1, 16), torch.uint8)
    assert q.state_cache_abi(TINY, 1) == ((1, 4, 128), torch.float32)


def test_named_formats_produce_abi_tensors():
    abi = q.cache_abi(FLASH, 1)
    g = torch.Generator().manual_seed(5)
    kv = torch.randn(1, 128, 1, 512, generator=g).bfloat16()
    key = torch.randn(1, 128, 1, 128, generator=g).bfloat16()
    for name, (a, b) in (("window_kv", q.quantize_window_kv(kv)),
                         ("compressed_kv", q.quantize_compressed_kv(kv)),
                         ("index_key", q.quantize_index_key(key))):
        assert (tuple(a.shape), a.dtype) == abi[name]
        assert (tuple(b.shape), b.dtype) == abi[name + "_scale"]
    p, s = q.quantize_window_kv(kv)
    assert q.dequantize_window_kv(p, s).shape == kv.shape


# ---- checkpoint weights ---------------------------------------------------------------------

def test_fp8_weight_block_scales():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(64, 96, generator=g)
    w = w * torch.pow(2.0, torch.randint(-8, 8, (64, 1), generator=g))
    w[32:, 64:] = 0.0
    payload, scales = q.quantize_fp8_weight(w)
    assert payload.dtype == torch.float8_e4m3fn and payload.shape == (64, 96)
    assert scales.dtype == torch.uint8 and scales.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            blk = w[32 * i:32 * i + 32, 32 * j:32 * j + 32]
            amax = float(blk.abs().max())
            assert int(scales[i, j]) == ref_ceil_log2(Fraction(amax) / 448) + 127
            s = math.ldexp(1.0, int(scales[i, j]) - 127)
            got = payload[32 * i:32 * i + 32, 32 * j:32 * j + 32].float().flatten().tolist()
            assert got == [math.copysign(ref_e4m3(v / s), v) if v else 0.0
                           for v in blk.flatten().tolist()]
    assert int(scales[1, 2]) == 0  # all-zero block: 2^-127
    deq = q.dequantize_fp8_weight(payload, scales)
    assert deq.dtype == torch.float32 and rel_l2(deq, w) < 0.03


def test_fp4_expert_weight_layout_and_int8_view():
    w = torch.zeros(2, 64)
    w[0, :6] = torch.tensor([6.0, 0.5, -1.0, 3.0, 0.0, -0.5])  # amax 6 -> scale 1
    w[1, 32:34] = torch.tensor([-48.0, 4.0])  # amax 48 -> scale 8
    packed, scales = q.quantize_fp4_expert_weight(w)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 32)
    assert scales.dtype == torch.uint8 and scales.shape == (2, 2)
    assert packed[0, :3].tolist() == [0x17, 0x5A, 0x90]
    assert packed[1, 16].tolist() == 0x1F  # codes 15 (-6) low, 1 (0.5) high
    assert scales.tolist() == [[127, 0], [0, 130]]  # zero groups: 2^-127
    ck = q.as_checkpoint_int8(packed)
    assert ck.dtype == torch.int8 and int(ck[0, 2]) == 0x90 - 256
    assert torch.equal(q.from_checkpoint_int8(ck), packed)
    assert torch.equal(q.dequantize_fp4_expert_weight(packed, scales), w)


def test_fp4_expert_weight_scale_rule():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(7)) * 0.05
    packed, scales = q.quantize_fp4_expert_weight(w)
    for r in range(8):
        for j in range(4):
            amax = float(w[r, 32 * j:32 * j + 32].abs().max())
            assert int(scales[r, j]) == ref_ceil_log2(Fraction(amax) / 6) + 127
    assert rel_l2(q.dequantize_fp4_expert_weight(packed, scales), w) < 0.13


# ---- MXFP8 linear ---------------------------------------------------------------------------

def _linear_operands(seed, t, k, n):
    g = torch.Generator().manual_seed(seed)
    group_scale = torch.pow(2.0, torch.randint(-6, 6, (t, k // 32), generator=g))
    x = (torch.randn(t, k, generator=g) * group_scale.repeat_interleave(32, 1)).bfloat16()
    w = torch.randn(n, k, generator=g) * 0.05
    wp, ws = q.quantize_fp8_weight(w)
    return x, wp, ws


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2 ** 31))
def test_mxfp8_linear_matches_fp64_reference(seed):
    t, k, n = 3, 96, 64
    x, wp, ws = _linear_operands(seed, t, k, n)
    y = q.mxfp8_linear(x, wp, ws, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and y.shape == (t, n)
    xa, sa = q.quantize_mxfp8_activation(x)
    xa_l, w_l = xa.double().tolist(), wp.double().tolist()
    sa_l, sw_l = sa.tolist(), ws.tolist()
    groups = k // 32
    for i in range(t):
        for j in range(n):
            terms = []
            for gi in range(groups):
                dot = sum(xa_l[i][c] * w_l[j][c] for c in range(32 * gi, 32 * gi + 32))
                terms.append(dot * 2.0 ** (sa_l[i][gi] - 127) * 2.0 ** (sw_l[j // 32][gi] - 127))
            exact = sum(terms)
            # each partial rounded once and each of (groups - 1) additions: <= 2^-24 relative
            bound = (2 * groups) * 2.0 ** -24 * sum(abs(v) for v in terms)
            assert abs(float(y[i, j]) - exact) <= bound
    y_bf = q.mxfp8_linear(x, wp, ws)
    assert y_bf.dtype == torch.bfloat16 and torch.equal(y_bf, y.bfloat16())  # one cast


def test_mxfp8_linear_matches_dequantized_matmul():
    x, wp, ws = _linear_operands(11, 8, 256, 96)
    xa, sa = q.quantize_mxfp8_activation(x)
    ref = q.dequantize_mxfp8(xa, sa).double() @ q.dequantize_fp8_weight(wp, ws).double().T
    y = q.mxfp8_linear(x, wp, ws, out_dtype=torch.float32)
    assert rel_l2(y, ref) < 1e-5


def test_mxfp8_linear_accumulates_groups_in_order_in_fp32():
    # dequantized x = 2^u, w = 2^v exactly; group partials (2^24, 1, -2^24):
    # FP32 in order gives (2^24 + 1 -> 2^24 by RNE) - 2^24 = 0; exact or reordered gives 1.
    def run(parts):
        x = torch.zeros(1, 32 * len(parts))
        w = torch.zeros(32, 32 * len(parts))
        for gi, (u, v) in enumerate(parts):
            x[0, 32 * gi] = 2.0 ** u
            w[0, 32 * gi] = math.copysign(2.0 ** abs(v), v)
        wp, ws = q.quantize_fp8_weight(w)
        return float(q.mxfp8_linear(x, wp, ws, out_dtype=torch.float32)[0, 0])
    assert run([(12, 12), (0, 0), (12, -12)]) == 0.0
    assert run([(12, 12), (12, -12), (0, 0)]) == 1.0


# ---- input validation -----------------------------------------------------------------------

E4 = torch.zeros(32, 64).to(torch.float8_e4m3fn)
U8 = torch.zeros(1, 2, dtype=torch.uint8)
U8_NAN = torch.full((1, 2), 255, dtype=torch.uint8)
U8_1x1 = torch.zeros(1, 1, dtype=torch.uint8)
PACKED_16 = torch.zeros(1, 8, dtype=torch.uint8)

BAD_INPUTS = [
    ("odd last dim to pack", lambda: q.pack_fp4(torch.zeros(3, dtype=torch.uint8)), "codes"),
    ("code > 15 to pack", lambda: q.pack_fp4(torch.full((2,), 16, dtype=torch.uint8)), "codes"),
    ("group not dividing dim", lambda: q.quantize_mxfp8(torch.zeros(2, 48), 32), "x"),
    ("zero group", lambda: q.quantize_mxfp8(torch.zeros(2, 48), 0), "group"),
    ("mxfp4 group", lambda: q.quantize_mxfp4(torch.zeros(2, 40), 16, "e4m3"), "x"),
    ("scale format", lambda: q.quantize_mxfp4(torch.zeros(2, 32), 16, "e5m2"), "scale_format"),
    ("non-power of two", lambda: q.e8m0_encode(torch.tensor([0.75])), "scale"),
    ("NaN to fp4", lambda: q.fp4_encode(torch.tensor([1.0, math.nan])), "x"),
    ("NaN to quantizer", lambda: q.quantize_mxfp8(torch.full((1, 32), math.nan)), "x"),
    ("negative ceil", lambda: q.ceil_pow2(torch.tensor([-1.0])), "x"),
    ("1-D weight", lambda: q.quantize_fp8_weight(torch.zeros(64)), "w"),
    ("N not multiple of 32", lambda: q.quantize_fp8_weight(torch.zeros(48, 64)), "w"),
    ("1-D expert", lambda: q.quantize_fp4_expert_weight(torch.zeros(64)), "w"),
    ("expert K", lambda: q.quantize_fp4_expert_weight(torch.zeros(2, 48)), "w"),
    ("scales shape", lambda: q.dequantize_fp8_weight(E4, U8_1x1), "scales"),
    ("x K mismatch", lambda: q.mxfp8_linear(torch.zeros(2, 32), E4, U8), "x"),
    ("x dtype", lambda: q.mxfp8_linear(torch.zeros(2, 64, dtype=torch.float64), E4, U8), "x"),
    ("NaN weight scale", lambda: q.mxfp8_linear(torch.zeros(2, 64), E4, U8_NAN), "w_scales"),
    ("out dtype", lambda: q.mxfp8_linear(torch.zeros(2, 64), E4, U8, out_dtype=torch.int32),
     "out_dtype"),
    ("e4m3 scale dtype", lambda: q.dequantize_compressed_kv(PACKED_16, U8_1x1), "scales"),
    ("decode dtype", lambda: q.e8m0_decode(torch.zeros(2)), "codes"),
    ("int8 view", lambda: q.from_checkpoint_int8(torch.zeros(2, dtype=torch.uint8)), "t"),
    ("num_blocks", lambda: q.cache_abi(FLASH, -1), "num_blocks"),
]


@pytest.mark.parametrize("fn,arg", [(f, a) for _, f, a in BAD_INPUTS],
                         ids=[d for d, _, _ in BAD_INPUTS])
def test_bad_input_raises_value_error_naming_argument(fn, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        fn()
