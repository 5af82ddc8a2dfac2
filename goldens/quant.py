"""Quantization formats of DeepSeek-V4.1-Flash: FP4 E2M1, E8M0, MXFP8/MXFP4 caches, weights.

Everything is pure torch on the CPU and upcasts to FP32/FP64 for arithmetic; float8 dtypes
are storage only.  E8M0 scales are carried as ``uint8`` codes (``code = log2(scale) + 127``,
255 = NaN) because torch's ``.to(torch.float8_e8m0fnu)`` rounds to nearest and cannot round
a scale *up*.

Scale rule.  DeepSeek does not use the OCP MX floor rule.  Every power-of-two scale here is
``2^ceil(log2(amax / elem_max))`` (elem_max 448 for E4M3, 6 for E2M1), computed exactly
from the bits of the value (:func:`ceil_pow2`), so ``|x / scale| <= elem_max`` and no
element ever clips.  The compressed KV cache is the exception: its scale is an E4M3
round-to-nearest-even cast of ``amax / 6`` (not a power of two), so elements may saturate
at +-6.

FP4 tie rule (module-level choice).  :func:`fp4_encode` rounds to the nearest E2M1 value and
breaks ties to the EVEN CODE, i.e. IEEE round-to-nearest-even on the E2M1 grid: ties at
0.25, 1.25, 2.5 and 5.0 round down, ties at 0.75, 1.75 and 3.5 round up.  Why: this is what
the hardware FP32->E2M1 cast does and what the published torch shims of the V4.1 formats
do.  The reference ``quantization.py`` breaks ties to the lower magnitude and the reference
golden to the even code; we follow the even code.

Errors are :class:`ValueError` naming the argument and the bound it breaks, raised before
any work is done.
"""

from __future__ import annotations

import torch

from goldens.config import MX_GROUP, CacheConfig, V41Config

E4M3_MAX = 448.0
FP4_MAX = 6.0
E8M0_NAN = 255
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
ACTIVATION_AMAX_FLOOR = 1e-4  # activation MXFP8: amax.clamp_min(1e-4) in FP32
MXFP4_RAW_FLOOR = 2.0 ** -9  # MXFP4 cache: min(amax / 6) = E4M3 min subnormal
SCALE_FORMATS = ("e8m0", "e4m3")

# Codes 0-7: magnitudes; bit 3 = sign.  Code 8 is -0.0.
FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                   -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Midpoints between consecutive magnitudes and whether the tie goes UP (to the even code).
_FP4_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                  (2.5, False), (3.5, True), (5.0, False))

_DEFAULT_CACHE = CacheConfig()


# ---- validation helpers --------------------------------------------------------------------

def _require_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _require_float(t, name: str) -> None:
    _require_tensor(t, name)
    if not t.dtype.is_floating_point or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"{name}: dtype {t.dtype} is not a float32/float64/bfloat16/float16 dtype")


def _require_dtype(t, name: str, dtype: torch.dtype) -> None:
    _require_tensor(t, name)
    if t.dtype != dtype:
        raise ValueError(f"{name}: dtype must be {dtype}, got {t.dtype}")


def _require_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: contains NaN or Inf; values must be finite")


def _require_group(group, name: str = "group") -> None:
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"{name}: must be a positive int, got {group!r}")


def _require_last_dim(t: torch.Tensor, name: str, group: int, gname: str = "group") -> int:
    if t.dim() < 1:
        raise ValueError(f"{name}: must have at least 1 dim, got a 0-d tensor")
    d = t.shape[-1]
    if d % group != 0:
        raise ValueError(f"{name}: last dim {d} is not a multiple of {gname} {group}")
    return d


def _require_count(n, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name}: must be an int >= 0, got {n!r}")


# ---- FP4 E2M1 ------------------------------------------------------------------------------

def fp4_encode(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, same shape) of ``x``, which is already divided by its scale.

    Rounds to the nearest E2M1 value with ties to the even code (see the module docstring),
    saturates magnitudes above 6 (including +-Inf) to +-6, and takes the sign from
    ``signbit`` so -0.0 and small negatives that round to zero give code 8.  Comparisons run
    in FP64, exact for every float32/bfloat16/float16/float64 input.  NaN raises.
    """
    _require_float(x, "x")
    if bool(torch.isnan(x).any()):
        raise ValueError("x: contains NaN; fp4_encode accepts finite or +-Inf values only")
    mag = x.detach().to(torch.float64).abs()
    code = torch.zeros(x.shape, dtype=torch.uint8)
    for mid, tie_up in _FP4_MIDPOINTS:
        code += (mag >= mid if tie_up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def fp4_decode(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of uint8 E2M1 codes (0-15); code 8 decodes to -0.0."""
    _require_dtype(codes, "codes", torch.uint8)
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: values must be <= 15 (4-bit E2M1), got {int(codes.max())}")
    table = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32)
    return table[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes two per byte: element 2i in the LOW nibble, 2i+1 in the high nibble.

    ``codes`` is uint8 with values <= 15 and an even last dim; the result is uint8 with the
    last dim halved.
    """
    _require_dtype(codes, "codes", torch.uint8)
    _require_last_dim(codes, "codes", 2, "pair size")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: values must be <= 15 (4-bit E2M1), got {int(codes.max())}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: uint8 ``[..., n]`` -> uint8 codes ``[..., 2n]``."""
    _require_dtype(packed, "packed", torch.uint8)
    if packed.dim() < 1:
        raise ValueError("packed: must have at least 1 dim, got a 0-d tensor")
    pairs = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


# ---- E8M0 and exact power-of-two ceiling --------------------------------------------------

def _pow2_f32(exp: torch.Tensor) -> torch.Tensor:
    """Exact FP32 ``2^exp`` for integer ``exp`` in [-127, 127] (built from FP64 bits)."""
    bits = (exp.to(torch.int64) + 1023) << 52
    return bits.view(torch.float64).to(torch.float32)


def _bit_length(n: torch.Tensor) -> torch.Tensor:
    """``int.bit_length`` of int64 values in [0, 2^53): the frexp exponent is exact there."""
    return torch.frexp(n.to(torch.float64)).exponent.to(torch.int64)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2 x)`` (int32) clamped to [-127, 127]; ``x = 0`` gives -127.

    Works on the IEEE bits (float32 or float64; bfloat16/float16 upcast exactly to float32):
    a normal value contributes its unbiased exponent plus one if any mantissa bit is set; a
    subnormal ``m * 2^-emin`` contributes ``-emin + bit_length(m - 1)``.  No float log2, so a
    value one ULP above a power of two always rounds UP.  Negative, NaN or Inf raise.
    """
    _require_float(x, "x")
    if bool((torch.isnan(x) | torch.isinf(x) | (x < 0)).any()):
        raise ValueError("x: values must be finite and >= 0 for ceil_log2 / ceil_pow2")
    if x.dtype == torch.float64:
        bits = x.detach().contiguous().view(torch.int64) & 0x7FFFFFFFFFFFFFFF
        mbits, bias, sub_exp = 52, 1023, -1074
        field = bits >> mbits
    else:
        x32 = x.detach().to(torch.float32).contiguous()
        bits = x32.view(torch.int32).to(torch.int64) & 0x7FFFFFFF
        mbits, bias, sub_exp = 23, 127, -149
        field = bits >> mbits
    mant = bits & ((1 << mbits) - 1)
    normal = field - bias + (mant != 0).to(torch.int64)
    subnormal = sub_exp + _bit_length((mant - 1).clamp_min(0))
    exp = torch.where(field > 0, normal, subnormal)
    exp = torch.where(bits == 0, torch.full_like(exp, E8M0_MIN_EXP), exp)
    return exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP).to(torch.int32)


def ceil_pow2(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``2^ceil(log2 x)`` with the exponent clamped to [-127, 127] (exact, see
    :func:`ceil_log2`); the smallest power of two >= ``x`` within the E8M0 range."""
    return _pow2_f32(ceil_log2(x))


def e8m0_encode(scale: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 code ``log2(scale) + 127`` of exact powers of two in [2^-127, 2^127].

    Anything else (zero, negative, NaN, Inf, not a power of two, out of range) raises; this
    function never rounds.
    """
    _require_float(scale, "scale")
    s = scale.detach().to(torch.float64)
    ok = torch.isfinite(s) & (s > 0)
    mant, exp = torch.frexp(torch.where(ok, s, torch.ones_like(s)))
    log2 = exp.to(torch.int64) - 1
    ok &= (mant == 0.5) & (log2 >= E8M0_MIN_EXP) & (log2 <= E8M0_MAX_EXP)
    if not bool(ok.all()):
        bad = float(s[~ok].flatten()[0])
        raise ValueError(f"scale: {bad!r} is not a power of two in [2^-127, 2^127]")
    return (log2 + 127).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """FP32 ``2^(code - 127)`` of uint8 E8M0 codes (exact; code 0 is the FP32 subnormal
    2^-127); code 255 decodes to NaN."""
    _require_dtype(codes, "codes", torch.uint8)
    c = codes.to(torch.int64)
    val = _pow2_f32(c.clamp_max(254) - 127)
    return torch.where(c == E8M0_NAN, torch.full_like(val, float("nan")), val)


def _codes_from_exp(exp: torch.Tensor) -> torch.Tensor:
    return (exp.to(torch.int64) + 127).to(torch.uint8)


# ---- MXFP8 --------------------------------------------------------------------------------

def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.detach().to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // group, group)


def _mxfp8(x: torch.Tensor, group: int, amax_floor: float | None):
    """Shared MXFP8 rule: FP32 amax (optionally floored), exact ceil-pow2 of amax/448."""
    _require_float(x, "x")
    _require_group(group)
    _require_last_dim(x, "x", group)
    _require_finite(x, "x")
    xg = _grouped(x, group)
    amax = xg.abs().amax(dim=-1)
    if amax_floor is not None:
        amax = amax.clamp_min(amax_floor)
    # FP64 amax/448 of an FP32 amax is never rounded onto a power of two it is not equal to,
    # so its ceil is the ceil of the exact quotient.  The exponent clamp is the 2^-127 floor.
    exp = ceil_log2(amax.to(torch.float64) / E4M3_MAX)
    scale = _pow2_f32(exp)
    payload = (xg / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return payload.reshape(x.shape), _codes_from_exp(exp)


def quantize_mxfp8(x: torch.Tensor, group: int = MX_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 cache quantization along the last dim.

    Per group of ``group`` elements: FP32 ``amax``, ``scale = ceil_pow2(max(amax/448,
    2^-127))`` (exact), payload ``clamp(x / scale, +-448)`` cast to E4M3 (RNE).  Returns
    ``(payload float8_e4m3fn same shape, scales uint8 E8M0 [..., D/group])``.  Since the
    scale is the ceiling, ``|x / scale| <= 448`` and the clamp never changes a value.
    """
    return _mxfp8(x, group, amax_floor=None)


def dequantize_mxfp8(payload: torch.Tensor, scales: torch.Tensor,
                     group: int = MX_GROUP) -> torch.Tensor:
    """FP32 ``payload * 2^(scale_code - 127)`` per group (exact)."""
    _require_dtype(payload, "payload", torch.float8_e4m3fn)
    _require_dtype(scales, "scales", torch.uint8)
    _require_group(group)
    d = _require_last_dim(payload, "payload", group)
    want = (*payload.shape[:-1], d // group)
    if tuple(scales.shape) != want:
        raise ValueError(f"scales: shape {tuple(scales.shape)} must be {want}")
    out = payload.to(torch.float32).reshape(*want, group) * e8m0_decode(scales)[..., None]
    return out.reshape(payload.shape)


def quantize_mxfp8_activation(x: torch.Tensor,
                              group: int = MX_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation MXFP8 (the upward released rule) per row, groups of ``group`` on the last dim.

    ``amax`` = FP32 max |x| of the group clamped to >= 1e-4 (FP32), ``scale =
    2^ceil(log2(amax/448))`` computed exactly (a one-ULP excess above a power of two rounds
    UP), payload ``clamp(x/scale, +-448)`` cast to E4M3 (RNE).  Returns ``(payload
    float8_e4m3fn, scales uint8 E8M0 [..., D/group])``.
    """
    return _mxfp8(x, group, amax_floor=ACTIVATION_AMAX_FLOOR)


# ---- MXFP4 --------------------------------------------------------------------------------

def _require_scale_format(scale_format) -> None:
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format: {scale_format!r} is not one of {SCALE_FORMATS}")


def _mxfp4(x: torch.Tensor, group: int, scale_format: str, raw_floor: float):
    _require_float(x, "x")
    _require_group(group)
    _require_scale_format(scale_format)
    _require_last_dim(x, "x", group)
    _require_last_dim(x, "x", 2, "pair size")
    _require_finite(x, "x")
    xg = _grouped(x, group)
    amax = xg.abs().amax(dim=-1)
    if scale_format == "e8m0":
        exp = ceil_log2((amax.to(torch.float64) / FP4_MAX).clamp_min(raw_floor))
        scale = _pow2_f32(exp)
        scales_out = _codes_from_exp(exp)
    else:
        raw = (amax / FP4_MAX).clamp_min(raw_floor).clamp_max(E4M3_MAX)
        scales_out = raw.to(torch.float8_e4m3fn)
        scale = scales_out.to(torch.float32)
    codes = fp4_encode((xg / scale[..., None]).clamp(-FP4_MAX, FP4_MAX))
    return pack_fp4(codes.reshape(x.shape)), scales_out


def quantize_mxfp4(x: torch.Tensor, group: int,
                   scale_format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (E2M1) cache quantization along the last dim.

    Per group: FP32 ``amax``, ``raw = max(amax/6, 2^-9)``.
    ``"e8m0"``: ``scale = ceil_pow2(raw)`` (exact), scales returned as uint8 E8M0 codes.
    ``"e4m3"``: ``scale = E4M3_RNE(min(raw, 448))`` with ``amax/6`` rounded in FP32 first
    (not a power of two; elements may saturate), scales returned as float8_e4m3fn.
    Payload: ``fp4_encode(clamp(x/scale, +-6))`` (FP32 quotient, then E2M1 RNE) packed two per
    byte -> uint8 ``[..., D/2]``.  The 2^-9 floor is the E4M3 min subnormal, so no scale is 0.
    """
    return _mxfp4(x, group, scale_format, MXFP4_RAW_FLOOR)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, group: int,
                     scale_format: str) -> torch.Tensor:
    """FP32 ``E2M1(code) * scale`` per group (exact) of a :func:`quantize_mxfp4` result."""
    _require_dtype(packed, "packed", torch.uint8)
    _require_group(group)
    _require_scale_format(scale_format)
    if packed.dim() < 1:
        raise ValueError("packed: must have at least 1 dim, got a 0-d tensor")
    d = 2 * packed.shape[-1]
    if d % group != 0:
        raise ValueError(f"packed: logical last dim {d} is not a multiple of group {group}")
    want = (*packed.shape[:-1], d // group)
    _require_dtype(scales, "scales", torch.uint8 if scale_format == "e8m0" else torch.float8_e4m3fn)
    if tuple(scales.shape) != want:
        raise ValueError(f"scales: shape {tuple(scales.shape)} must be {want}")
    scale = e8m0_decode(scales) if scale_format == "e8m0" else scales.to(torch.float32)
    vals = fp4_decode(unpack_fp4(packed)).reshape(*want, group) * scale[..., None]
    return vals.reshape(*packed.shape[:-1], d)


# ---- named cache formats ------------------------------------------------------------------

def quantize_window_kv(x: torch.Tensor, group: int = _DEFAULT_CACHE.window_group):
    """Window KV publication: MXFP8 E4M3 payload + E8M0 scale per ``group`` (32)."""
    return quantize_mxfp8(x, group)


def dequantize_window_kv(payload: torch.Tensor, scales: torch.Tensor,
                         group: int = _DEFAULT_CACHE.window_group) -> torch.Tensor:
    """FP32 window KV rows from :func:`quantize_window_kv` output."""
    return dequantize_mxfp8(payload, scales, group)


def quantize_compressed_kv(x: torch.Tensor, group: int = _DEFAULT_CACHE.compressed_group):
    """Compressed KV publication: packed E2M1 + E4M3 (RNE, non-pow2) scale per ``group`` (16)."""
    return quantize_mxfp4(x, group, "e4m3")


def dequantize_compressed_kv(packed: torch.Tensor, scales: torch.Tensor,
                             group: int = _DEFAULT_CACHE.compressed_group) -> torch.Tensor:
    """FP32 compressed KV rows from :func:`quantize_compressed_kv` output."""
    return dequantize_mxfp4(packed, scales, group, "e4m3")


def quantize_index_key(x: torch.Tensor, group: int = _DEFAULT_CACHE.index_group):
    """Index-key publication: packed E2M1 + E8M0 (ceil) scale per ``group`` (32)."""
    return quantize_mxfp4(x, group, "e8m0")


def dequantize_index_key(packed: torch.Tensor, scales: torch.Tensor,
                         group: int = _DEFAULT_CACHE.index_group) -> torch.Tensor:
    """FP32 index keys from :func:`quantize_index_key` output."""
    return dequantize_mxfp4(packed, scales, group, "e8m0")


def cache_abi(config: V41Config, num_blocks: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Production paged-cache tensors: name -> (shape, dtype), ``[blocks, block_size, 1, .]``.

    window_kv E4M3 ``head_dim`` + uint8 E8M0 ``head_dim/window_group``; compressed_kv packed
    uint8 ``head_dim/2`` + E4M3 ``head_dim/compressed_group``; index_key packed uint8
    ``index.head_dim/2`` + uint8 E8M0 ``index.head_dim/index_group``.
    """
    _require_count(num_blocks, "num_blocks")
    c = config.cache
    row = (num_blocks, c.block_size, 1)
    d, di = config.head_dim, config.index.head_dim
    return {
        "window_kv": ((*row, d), torch.float8_e4m3fn),
        "window_kv_scale": ((*row, d // c.window_group), torch.uint8),
        "compressed_kv": ((*row, d // 2), torch.uint8),
        "compressed_kv_scale": ((*row, d // c.compressed_group), torch.float8_e4m3fn),
        "index_key": ((*row, di // 2), torch.uint8),
        "index_key_scale": ((*row, di // c.index_group), torch.uint8),
    }


def state_cache_abi(config: V41Config,
                    num_state_blocks: int) -> tuple[tuple[int, int, int], torch.dtype]:
    """Ratio-2 compressor state ring: ``((blocks, state_capacity, 2*head_dim), float32)``."""
    _require_count(num_state_blocks, "num_state_blocks")
    return (num_state_blocks, config.cache.state_capacity, config.state_width), torch.float32


# ---- checkpoint weights -------------------------------------------------------------------

def _require_weight(w: torch.Tensor, name: str, n_mult: int, k_mult: int) -> tuple[int, int]:
    if w.dim() != 2:
        raise ValueError(f"{name}: must be 2-D [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    if n % n_mult or n == 0:
        raise ValueError(f"{name}: N = {n} must be a positive multiple of {n_mult}")
    if k % k_mult or k == 0:
        raise ValueError(f"{name}: K = {k} must be a positive multiple of {k_mult}")
    return n, k


def quantize_fp8_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint FP8 linear: output-major ``[N, K]`` E4M3 payload, one E8M0 per 32x32 block.

    ``scale = ceil_pow2(amax_block / 448)`` (exact; an all-zero block gets 2^-127), payload
    ``w / scale`` cast to E4M3 (RNE; never clips).  Returns ``(payload [N, K], uint8 scales
    [N/32, K/32])``.
    """
    _require_float(w, "w")
    n, k = _require_weight(w, "w", MX_GROUP, MX_GROUP)
    _require_finite(w, "w")
    g = MX_GROUP
    blocks = w.detach().to(torch.float32).reshape(n // g, g, k // g, g)
    amax = blocks.abs().amax(dim=(1, 3))
    exp = ceil_log2(amax.to(torch.float64) / E4M3_MAX)
    scale = _pow2_f32(exp)[:, None, :, None]
    payload = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return payload.reshape(n, k), _codes_from_exp(exp)


def _require_fp8_weight(payload: torch.Tensor, scales: torch.Tensor,
                        pname: str, sname: str) -> tuple[int, int]:
    _require_dtype(payload, pname, torch.float8_e4m3fn)
    _require_dtype(scales, sname, torch.uint8)
    n, k = _require_weight(payload, pname, MX_GROUP, MX_GROUP)
    want = (n // MX_GROUP, k // MX_GROUP)
    if tuple(scales.shape) != want:
        raise ValueError(f"{sname}: shape {tuple(scales.shape)} must be {want} (one per 32x32)")
    if scales.numel() and int(scales.max()) == E8M0_NAN:
        raise ValueError(f"{sname}: contains E8M0 code 255 (NaN); codes must be <= 254")
    return n, k


def dequantize_fp8_weight(payload: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP32 ``[N, K]`` weight of a :func:`quantize_fp8_weight` result (exact)."""
    n, k = _require_fp8_weight(payload, scales, "payload", "scales")
    g = MX_GROUP
    vals = payload.to(torch.float32).reshape(n // g, g, k // g, g)
    return (vals * e8m0_decode(scales)[:, None, :, None]).reshape(n, k)


def quantize_fp4_expert_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed-expert checkpoint weight: packed E2M1 ``[N, K/2]`` uint8 (element 2i in the low
    nibble) and uint8 E8M0 scales ``[N, K/32]``, one per 32 input columns.

    ``scale = ceil_pow2(max(amax/6, 2^-127))`` (exact), payload ``fp4_encode(w / scale)``
    (never clips).  See :func:`as_checkpoint_int8` for the released int8 view.
    """
    _require_float(w, "w")
    _require_weight(w, "w", 1, MX_GROUP)
    return _mxfp4(w, MX_GROUP, "e8m0", 0.0)


def dequantize_fp4_expert_weight(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP32 ``[N, K]`` expert weight from packed uint8 ``[N, K/2]`` + uint8 ``[N, K/32]``."""
    _require_dtype(packed, "packed", torch.uint8)
    if packed.dim() != 2:
        raise ValueError(f"packed: must be 2-D [N, K/2], got shape {tuple(packed.shape)}")
    return dequantize_mxfp4(packed, scales, MX_GROUP, "e8m0")


def as_checkpoint_int8(packed: torch.Tensor) -> torch.Tensor:
    """int8 view (same bytes) of packed uint8 FP4, as the released checkpoint stores it."""
    _require_dtype(packed, "packed", torch.uint8)
    return packed.view(torch.int8)


def from_checkpoint_int8(t: torch.Tensor) -> torch.Tensor:
    """uint8 view (same bytes) of a checkpoint int8 packed FP4 tensor."""
    _require_dtype(t, "t", torch.int8)
    return t.view(torch.uint8)


# ---- MXFP8 linear -------------------------------------------------------------------------

_OUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def mxfp8_linear(x: torch.Tensor, w_payload: torch.Tensor, w_scales: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``y = MX(x) @ W^T`` with a checkpoint FP8 weight, group-32 partials in FP32.

    ``x`` ``[T, K]`` (BF16/FP32) is quantized with :func:`quantize_mxfp8_activation`;
    ``w_payload`` ``[N, K]`` E4M3 with uint8 E8M0 ``w_scales`` ``[N/32, K/32]``.
    ``y[t, n] = sum_g (dot_g(x, w) * sa[t, g]) * sw[n // 32, g]``, g ascending, accumulated
    in FP32, then ONE cast to ``out_dtype``.  Each group dot is the correctly rounded FP32
    value of the exact dot (E4M3 products are integer multiples of 2^-18 below 2^18, so the
    32-term FP64 sum is exact): a hardware FP32 dot in any order is within 31 roundings of it.
    Streams one K-group at a time: peak extra memory is O(T*N) FP64 plus an O(N*K) byte copy.
    """
    _require_tensor(x, "x")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"x: dtype must be torch.bfloat16 or torch.float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: must be 2-D [T, K], got shape {tuple(x.shape)}")
    n, k = _require_fp8_weight(w_payload, w_scales, "w_payload", "w_scales")
    if x.shape[1] != k:
        raise ValueError(f"x: K = {x.shape[1]} must equal w_payload K = {k}")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: {out_dtype} is not one of {_OUT_DTYPES}")
    g = MX_GROUP
    xa, sa_codes = quantize_mxfp8_activation(x, g)
    xa64 = xa.to(torch.float64)
    sa = e8m0_decode(sa_codes)
    sw_t = e8m0_decode(w_scales).repeat_interleave(g, dim=0).T.contiguous()  # [K/32, N]
    w_t = w_payload.T.contiguous()  # [K, N] E4M3 bytes: contiguous group slices
    acc = torch.zeros(x.shape[0], n, dtype=torch.float32)
    for j in range(k // g):
        rows = slice(j * g, (j + 1) * g)
        part = torch.mm(xa64[:, rows], w_t[rows].to(torch.float64)).to(torch.float32)
        part.mul_(sa[:, j:j + 1]).mul_(sw_t[j][None, :])
        acc.add_(part)
    return acc.to(out_dtype)
