"""Trace-time publication shared by the compressor kernels (golden:
``goldens.compressor.compress_and_publish``, publication part).

From a tile of BF16 unrotated latents ``[rows, d]`` and their compressed positions:

* compressed KV = ``RoPE(latent)`` on the last ``rope_dim`` channels [BF16] -> MXFP4 g16
  with E4M3 scales;
* index key = ``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))`` [BF16] from the
  UNROTATED latent -> MXFP4 g32 with E8M0 scales;
* both quantized here; each kernel writes the rows to physical row ``slot`` of the four
  paged caches itself (one ``assemble`` per row and tensor under a runtime ``if``, which
  must sit in the jit body; reshaped views of inout args are not written back).

RoPE is the adjacent-pair rotation ``(re, im) -> (re c - im s, im c + re s)`` in FP32 with
one BF16 cast: the table rows are gathered with ``index_select`` at ``max(position, 0)``,
spread to the pair width by a column gather, and the pair partner ``x[j ^ 1]`` is another
column gather; ``re c + (-im) s`` rounds exactly like ``re c - im s``.
"""

from v41 import mx_fp4


def rms_norm_rows(pypto, x32, weight32, rows, valid, width, eps):
    """BF16 ``x * rsqrt(mean(x^2) + eps) * w`` of FP32 rows (FP32 statistic)."""
    pypto.set_vec_tile_shapes(min(rows, 8), width)
    mean_sq = pypto.mul(pypto.sum(pypto.mul(x32, x32), -1, keepdim=True), 1.0 / width)
    y = pypto.mul(pypto.mul(x32, pypto.rsqrt(pypto.add(mean_sq, eps))),
                  pypto.expand_clone(weight32, [rows, width], valid_shape=[valid, width]))
    return pypto.cast(y, pypto.DT_BF16)


def table_rows(pypto, freqs_cos, freqs_sin, positions, rows, rd):
    """FP32 ``(cos, sin)`` ``[rows, rd / 2]``: the tables' rows at INT32 ``positions
    [rows]`` (a negative position reads row 0)."""
    pypto.set_vec_tile_shapes(rows)
    safe = pypto.maximum(positions, 0)
    pypto.set_vec_tile_shapes(rows, rd // 2)
    return pypto.index_select(freqs_cos, 0, safe), pypto.index_select(freqs_sin, 0, safe)


def rope_factors(pypto, freqs_cos, freqs_sin, positions, rows, valid, rd):
    """FP32 ``(cos, signed sin)`` ``[rows, rd]`` for INT32 ``positions [rows]``: column
    ``j`` holds ``cos[p, j // 2]`` and ``(-1)^(j+1) sin[p, j // 2]``."""
    cos_h, sin_h = table_rows(pypto, freqs_cos, freqs_sin, positions, rows, rd)
    pypto.set_vec_tile_shapes(rd)
    col = pypto.arange(0.0, float(rd), 1.0)
    pair = pypto.floor(pypto.mul(col, 0.5))
    odd = pypto.sub(col, pypto.mul(pair, 2.0))
    sign = pypto.reshape(pypto.sub(pypto.mul(odd, 2.0), 1.0), [1, rd])
    pair_i = pypto.cast(pair, pypto.DT_INT32)
    pypto.set_vec_tile_shapes(min(rows, 8), rd)
    cos_f = pypto.index_select(cos_h, 1, pair_i)
    sin_f = pypto.index_select(sin_h, 1, pair_i)
    sin_f = pypto.mul(sin_f, pypto.expand_clone(sign, [rows, rd], valid_shape=[valid, rd]))
    return cos_f, sin_f


def partner_index(pypto, rd):
    """INT32 ``[rd]`` column indices ``j ^ 1`` (the pair partner)."""
    pypto.set_vec_tile_shapes(rd)
    col = pypto.arange(0.0, float(rd), 1.0)
    odd = pypto.sub(col, pypto.mul(pypto.floor(pypto.mul(col, 0.5)), 2.0))
    return pypto.cast(pypto.sub(pypto.add(col, 1.0), pypto.mul(odd, 2.0)), pypto.DT_INT32)


def rope_tail(pypto, x, cos_f, sin_f, partner, rows, valid, width, rd):
    """BF16 ``[rows, width]``: ``x`` (BF16) with its last ``rd`` channels rotated."""
    nope = width - rd
    pypto.set_vec_tile_shapes(min(rows, 8), width)
    x32 = pypto.cast(x, pypto.DT_FP32)
    tail = pypto.view(x32, [rows, rd], [0, nope], valid_shape=[valid, rd])
    pypto.set_vec_tile_shapes(min(rows, 8), rd)
    swapped = pypto.index_select(tail, 1, partner)
    rot = pypto.cast(pypto.add(pypto.mul(tail, cos_f), pypto.mul(swapped, sin_f)), pypto.DT_BF16)
    if nope == 0:
        return rot
    head = pypto.view(x, [rows, nope], [0, 0], valid_shape=[valid, nope])
    pypto.set_vec_tile_shapes(min(rows, 8), width)
    out = pypto.concat([head, rot], -1)
    return pypto.view(out, [rows, width], [0, 0], valid_shape=[valid, width])


def encode_tile(pypto, latent, positions, *, freqs_cos, freqs_sin, index_wk, index_norm32,
                rows, valid, dims, eps, variant=frozenset()):
    """``(kv packed, kv scales, key packed, key scales)`` uint8 tiles of ``rows`` latents.

    ``latent`` BF16 ``[rows, d]`` (unrotated); ``positions`` INT32 ``[rows]`` compressed
    positions.  ``variant`` holds wrong-kernel switches: ``"index_from_rotated"``,
    ``"fp4_toward_zero"``.  The caller writes the rows (a runtime ``if`` must sit in the
    jit body itself).
    """
    d, di, rd = dims["head_dim"], dims["index_dim"], dims["rope_dim"]
    toward_zero = "fp4_toward_zero" in variant
    cos_f, sin_f = rope_factors(pypto, freqs_cos, freqs_sin, positions, rows, valid, rd)
    partner = partner_index(pypto, rd)
    rot_kv = rope_tail(pypto, latent, cos_f, sin_f, partner, rows, valid, d, rd)
    src = rot_kv if "index_from_rotated" in variant else latent
    pypto.set_vec_tile_shapes(min(rows, 8), min(d, 512))
    k32 = pypto.matmul(src, index_wk, pypto.DT_FP32)  # [rows, di]
    pypto.set_vec_tile_shapes(min(rows, 8), di)
    k32 = pypto.cast(pypto.cast(k32, pypto.DT_BF16), pypto.DT_FP32)
    key = rms_norm_rows(pypto, k32, index_norm32, rows, valid, di, eps)
    rot_key = rope_tail(pypto, key, cos_f, sin_f, partner, rows, valid, di, rd)
    kv_p, kv_s = mx_fp4.quantize_tile(pypto, rot_kv, rows, valid, d, dims["kv_group"], "e4m3",
                                      toward_zero=toward_zero)
    ik_p, ik_s = mx_fp4.quantize_tile(pypto, rot_key, rows, valid, di, dims["ik_group"], "e8m0",
                                      toward_zero=toward_zero)
    return kv_p, kv_s, ik_p, ik_s
