"""Trace-time publication shared by the compressor kernels (golden:
``goldens.compressor.compress_and_publish``, publication part).

From a tile of BF16 unrotated latents ``[rows, d]`` and their compressed positions:

* compressed KV = ``RoPE(latent)`` on the last ``rope_dim`` channels [BF16] -> MXFP4 g16
  with E4M3 scales;
* index key = ``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))`` [BF16] from the
  UNROTATED latent -> MXFP4 g32 with E8M0 scales;
* both quantized here and written to physical row ``slot`` of the four paged caches by
  :func:`publish_latent`'s stages: one ``assemble`` per row and tensor of a view whose
  runtime row count is 1 for a live row and 0 otherwise (a zero-row view writes nothing),
  so the writes need no runtime ``if`` and stay inside their stage's task.

RoPE is the adjacent-pair rotation ``(re, im) -> (re c - im s, im c + re s)`` in FP32 with
one BF16 cast: the table rows are gathered with ``index_select`` at ``max(position, 0)``,
spread to the pair width by a column gather, and the pair partner ``x[j ^ 1]`` is another
column gather; ``re c + (-im) s`` rounds exactly like ``re c - im s``.
"""

from v41 import mx_fp4
from v41.subgraph import one_subgraph

K_STEP = 256  # the interpreter's K piece, gcd of the projections' L1 K tiles
INDEX_N = 128  # index projection N tile (one task per encode tile)
GROUP_ROWS = 256  # MXFP4 group rows per vector tile (one tile for 8 rows of 512)


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


def _rope_full32(pypto, x, freqs_cos, freqs_sin, positions, rows, valid, width, rd):
    """FP32 ``[rows, width]``: BF16 ``x`` with its last ``rd`` channels rotated and rounded to
    BF16 -- :func:`v41.compressor_common.rope_tail`'s values, computed over the whole width
    (table and partner gathers by a full-width column index) and selected per column with
    ``where``, so no concatenation goes through global memory.  The rotated columns run the
    same FP32 operations as ``rope_tail``; the others are ``x`` itself."""
    nope = width - rd
    cos_h, sin_h = table_rows(pypto, freqs_cos, freqs_sin, positions, rows, rd)
    pypto.set_vec_tile_shapes(width)
    col = pypto.arange(0.0, float(width), 1.0)
    rel = pypto.maximum(pypto.add(col, -float(nope)), 0.0)  # tail column j - nope, else 0
    pair = pypto.floor(pypto.mul(rel, 0.5))
    odd = pypto.sub(rel, pypto.mul(pair, 2.0))
    sign = pypto.reshape(pypto.sub(pypto.mul(odd, 2.0), 1.0), [1, width])
    pair_i = pypto.cast(pair, pypto.DT_INT32)
    partner = pypto.cast(pypto.sub(pypto.add(col, 1.0), pypto.mul(odd, 2.0)), pypto.DT_INT32)
    tail = pypto.reshape(pypto.ge(col, float(nope)), [1, width])
    pypto.set_vec_tile_shapes(min(rows, 8), width)
    cos_f = pypto.index_select(cos_h, 1, pair_i)
    sin_f = pypto.index_select(sin_h, 1, pair_i)
    sin_f = pypto.mul(sin_f, pypto.expand_clone(sign, [rows, width], valid_shape=[valid, width]))
    x32 = pypto.cast(x, pypto.DT_FP32)
    swapped = pypto.index_select(x32, 1, partner)
    rot = pypto.cast(pypto.add(pypto.mul(x32, cos_f), pypto.mul(swapped, sin_f)), pypto.DT_BF16)
    rot = pypto.cast(rot, pypto.DT_FP32)
    keep = pypto.expand_clone(tail, [rows, width], valid_shape=[valid, width])
    return pypto.where(keep, rot, x32)


def _publish_rows(pypto, vals, scodes, cache, cache_scale, lives, slots, rows):
    """Row ``r`` of the FP32 4-D tiles cast to uint8 and written at ``slots[r]`` when
    ``lives[r]`` is 1 (a zero-row view writes nothing)."""
    bs = cache.shape[1]
    w, g = cache.shape[3], cache_scale.shape[3]
    for r in range(rows):
        at = [slots[r] // bs, slots[r] % bs, 0, 0]
        pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, w)
        pypto.assemble(pypto.cast(pypto.view(vals, [1, 1, 1, w], [r, 0, 0, 0],
                                             valid_shape=[lives[r], 1, 1, w]), pypto.DT_UINT8),
                       at, cache)
        pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, max(g, 32))
        pypto.assemble(pypto.cast(pypto.view(scodes, [1, 1, 1, g], [r, 0, 0, 0],
                                             valid_shape=[lives[r], 1, 1, g]), pypto.DT_UINT8),
                       at, cache_scale)


def _row_slots(compressed_slots, position_ids, start, active, valid, rows, lowest):
    """Per tile row: the physical slot (>= 0) and live (1 when the row is real, its slot
    >= 0 and its position >= lowest, else 0).  Rows past the tokens read the last token's."""
    lives, slots = [], []
    for r in range(rows):
        t = (start + r).min(active - 1)
        slot = compressed_slots[t]
        p = position_ids[t]
        live = (slot + 1).max(0).min(1).min((p - lowest + 1).max(0).min(1)).min(
            (valid - r).max(0))
        lives.append(live)
        slots.append(slot.max(0))
    return lives, slots


def _encode_rows(pypto, x, rows, valid, width, group, scale_format, switches, where, cache,
                 cache_scale):
    """MXFP4 of the tile ``x`` (:func:`v41.mx_fp4.quantize_tile`) and its live rows' writes
    into ``cache`` / ``cache_scale``; ``where`` is ``(compressed_slots, position_ids, start,
    active, lowest)``."""
    compressed_slots, position_ids, start, active, lowest = where
    vals, scodes = mx_fp4.quantize_tile(pypto, x, rows, valid, width, group, scale_format,
                                        toward_zero="fp4_toward_zero" in switches,
                                        group_rows=GROUP_ROWS, rows4d=True)
    lives, slots = _row_slots(compressed_slots, position_ids, start, active, valid, rows, lowest)
    _publish_rows(pypto, vals, scodes, cache, cache_scale, lives, slots, rows)


def _tile_positions(pypto, position_ids, start, rows, valid, pos_shift):
    """INT32 ``[rows]`` RoPE positions of a tile: ``position_ids[start:]`` plus ``pos_shift``
    (ratio 2 publishes at ``p - 1``)."""
    pypto.set_vec_tile_shapes(rows)
    pos = pypto.view(position_ids, [rows], [start], valid_shape=[valid])
    return pos if pos_shift == 0 else pypto.add(pos, pos_shift)


def _kv_stage(pypto, latent, rows, valid, start, active, position_ids, compressed_slots,
              freqs_cos, freqs_sin, compressed_kv, compressed_kv_scale, dm, lowest, switches,
              pos_shift=0):
    """RoPE'd MXFP4 KV of a tile's latents and its rows' writes: one task.  Returns the
    rotated latent (the index projection's input of the ``index_from_rotated`` variant)."""
    d, rd = dm["head_dim"], dm["rope_dim"]
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(min(rows, 8), d)
        latent = pypto.view(latent, [rows, d], [0, 0], valid_shape=[valid, d])
        pos = _tile_positions(pypto, position_ids, start, rows, valid, pos_shift)
        rot_kv = _rope_full32(pypto, latent, freqs_cos, freqs_sin, pos, rows, valid, d, rd)
        _encode_rows(pypto, rot_kv, rows, valid, d, dm["kv_group"], "e4m3", switches,
                     (compressed_slots, position_ids, start, active, lowest),
                     compressed_kv, compressed_kv_scale)
    return rot_kv


def _key_stage(pypto, k32, rows, valid, start, active, position_ids, compressed_slots,
               index_norm, freqs_cos, freqs_sin, index_key, index_key_scale, dm, eps, lowest,
               switches, pos_shift=0):
    """Index key of one tile from its FP32 projection: RMSNorm, RoPE, MXFP4, row writes;
    one task."""
    di, rd = dm["index_dim"], dm["rope_dim"]
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(1, di)
        index_norm32 = pypto.reshape(index_norm, [1, di])
        pypto.set_vec_tile_shapes(min(rows, 8), di)
        k32 = pypto.view(k32, [rows, di], [0, 0], valid_shape=[valid, di])
        k32 = pypto.cast(pypto.cast(k32, pypto.DT_BF16), pypto.DT_FP32)
        key = rms_norm_rows(pypto, k32, index_norm32, rows, valid, di, eps)
        pos = _tile_positions(pypto, position_ids, start, rows, valid, pos_shift)
        cos_f, sin_f = rope_factors(pypto, freqs_cos, freqs_sin, pos, rows, valid, rd)
        partner = partner_index(pypto, rd)
        rot_key = rope_tail(pypto, key, cos_f, sin_f, partner, rows, valid, di, rd)
        _encode_rows(pypto, rot_key, rows, valid, di, dm["ik_group"], "e8m0", switches,
                     (compressed_slots, position_ids, start, active, lowest),
                     index_key, index_key_scale)


def index_k_tile(head_dim: int) -> int:
    """L1 K tile of the index projection's latent operand: its whole row when ``head_dim``
    is a multiple of K_STEP (one copy-in instead of one per K_STEP; the cost model charges
    ~1,400 cycles of latency a copy), else K_STEP.  ``index_wk`` keeps K_STEP pieces, so the
    interpreter's K piece (the gcd) stays K_STEP and the bits do not change.  FLASH
    (head_dim 512, 3 copy-ins instead of 4): compressor_ratio1 T=192 49.1 -> 47.9 us, 180
    active 48.5 -> 47.3, T=2048 329.0 -> 319.1; compressor_ratio2 T=192 102.3 -> 100.9."""
    return head_dim if head_dim > K_STEP and head_dim % K_STEP == 0 else K_STEP


def publish_latent(pypto, latent, rows, valid, start, active, x_args, dm, eps, lowest,
                   switches, pos_shift=0):
    """Publication of a tile of BF16 latents (rows ``start ..``, ``valid`` real, tokens
    below ``active``) for both compressors (ratio 2 with ``pos_shift`` -1): KV stage (one
    task), index projection (cube), key stage (one task), each stage writing its live rows
    itself; RoPE at ``position_ids + pos_shift``.
    ``x_args`` = ``(position_ids, compressed_slots, norm, index_wk, index_norm, freqs_cos,
    freqs_sin, compressed_kv, compressed_kv_scale, index_key, index_key_scale)``."""
    (position_ids, compressed_slots, _norm, index_wk, index_norm, freqs_cos, freqs_sin,
     compressed_kv, compressed_kv_scale, index_key, index_key_scale) = x_args
    rot_kv = _kv_stage(pypto, latent, rows, valid, start, active, position_ids,
                       compressed_slots, freqs_cos, freqs_sin, compressed_kv,
                       compressed_kv_scale, dm, lowest, switches, pos_shift)
    if "index_from_rotated" in switches:
        pypto.set_vec_tile_shapes(min(rows, 8), dm["head_dim"])
        src = pypto.cast(rot_kv, pypto.DT_BF16)
    else:
        src = latent
    pypto.set_vec_tile_shapes(min(rows, 8), min(dm["head_dim"], 512))
    pypto.set_cube_tile_shapes([16, 16], [64, index_k_tile(dm["head_dim"]), K_STEP],
                               [INDEX_N, INDEX_N])
    k32 = pypto.matmul(src, index_wk, pypto.DT_FP32)  # [rows, di]
    _key_stage(pypto, k32, rows, valid, start, active, position_ids, compressed_slots,
               index_norm, freqs_cos, freqs_sin, index_key, index_key_scale, dm, eps, lowest,
               switches, pos_shift)
