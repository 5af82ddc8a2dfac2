"""Gather and decode of paged KV-cache rows by whole rows (trace-time helpers), shared by the
kernels that read the window, compressed or index-key caches (sparse attention, paged
indexer).

A cache row is ``d`` logical elements in groups of ``group``, one scale byte a group; a row
id is ``block * block_size + offset`` (``-1`` = no key).  The payload and the scale bytes of
a cache are read through GM reshapes (no copy) with one row per group:

* MXFP8 window rows: ``[rows * d/group, group]`` E4M3 codes, scales ``[rows * d/group]`` E8M0;
* MXFP4 compressed / index-key rows: ``[rows * d/group, group/2]`` packed E2M1 pairs (element
  ``2i`` in the LOW nibble of byte ``i``), scales E4M3 (compressed KV) or E8M0 (index keys).

Group ``s`` of key ``j`` is gathered at slot ``max(id_j, 0) * (d/group) + s`` (INT32: an FP32
slot is wrong past 2^24; the deliberately wrong ``fp32_rows`` keeps it), so payload and
scale land in the same ``[n, group]`` tile layout, one scale per tile row.  The slots and
the scale bytes come from one task; every other step of one decode runs in that layout,
forced into one subgraph (:mod:`v41.subgraph`), up to the BF16 ``[keys, d]`` result: an
FP8 code is one gather from an E4M3 value table, an FP4 element one gather (its byte
chosen by a column gather) from a table of both nibbles' E2M1 values.  Tables hold an
entry at ``code + 128`` so a byte the interpreter reads as signed (-128..127) and a card
reads as unsigned (0..255) find the same value.  The
arithmetic decoders of :mod:`v41.mx_decode` loaded ``[rows, d]`` tiles and reshaped them on
chip into the group layout, and each reshape went through global memory and back.

Rounding boundary: none until the BF16 cast of ``value * scale``, which is exact: an E4M3
or E2M1 value times a power of two (or an E4M3 scale) has at most 6 significant bits, so the
cast rounds the ``exp`` estimate of the powers away (golden:
``goldens.quant.dequantize_window_kv`` / ``dequantize_compressed_kv``).
"""

from v41 import mx_decode
from v41.subgraph import one_subgraph

TABLE_SPAN = mx_decode.TABLE_SPAN  # entries of a byte table: signed or unsigned, plus 128
TILE_ELEMS = 16384  # [rows, group] FP32 tiles of 64 KB (a quarter of the A5's UB)


def nibble_table(pypto, *, high_first=False):
    """FP32 ``[768]``: entries ``0..383`` the E2M1 value of the LOW nibble of byte
    ``(k - 128) mod 256``, entries ``384..767`` that of its HIGH nibble.  ``high_first``
    swaps the halves (a deliberately wrong reading for the wrong-kernel tests)."""
    pypto.set_vec_tile_shapes(2 * TABLE_SPAN)
    k = pypto.arange(0.0, float(2 * TABLE_SPAN), 1.0)
    # 0 for the low-nibble half, 1 for the high one (+0.5: 1/384 is not exact in FP32)
    upper = pypto.floor(pypto.mul(pypto.add(k, 0.5), 1.0 / TABLE_SPAN))
    b = mx_decode.byte_mod(pypto, pypto.sub(pypto.sub(k, pypto.mul(upper, float(TABLE_SPAN))),
                                            128.0))
    if high_first:
        upper = pypto.add(pypto.mul(upper, -1.0), 1.0)
    high = pypto.floor(pypto.mul(b, 1.0 / 16.0))
    low = pypto.sub(b, pypto.mul(high, 16.0))
    return mx_decode.e2m1_values(pypto, pypto.add(low, pypto.mul(upper, pypto.sub(high, low))))


def group_rows(group: int) -> int:
    """Rows of a ``[rows, group]`` decode tile (:data:`TILE_ELEMS` FP32 elements)."""
    return TILE_ELEMS // group


def slot_constants(pypto, keys, groups):
    """INT32 ``[keys * groups]``: the key of each slot of a ``keys``-row gather, an index
    the gathers read from global memory.  Built before the loops it has an edge to every
    reading task, resolved one at a time; ``sparse_attention`` and ``paged_indexer`` build
    it in the reading task."""
    pypto.set_vec_tile_shapes(min(keys * groups, TILE_ELEMS))
    iota = pypto.arange(0.0, float(keys * groups), 1.0)
    return pypto.cast(pypto.floor(pypto.mul(pypto.add(iota, 0.5), 1.0 / groups)),
                      pypto.DT_INT32)


def nibble_constants(pypto, group):
    """``(byte_of, offset)`` of the FP4 decode of ``group``-element groups: INT32
    ``[group]`` = ``k // 2`` (element ``k``'s byte) and FP32 ``[1, group]`` = ``128`` for even
    ``k`` (low nibble) and ``128 + 384`` for odd ``k``: the entry of element ``k`` in
    :func:`nibble_table` is ``byte + offset``.  (As :func:`slot_constants`: built in the
    reading task where the launch has many.)"""
    pypto.set_vec_tile_shapes(group)
    col = pypto.arange(0.0, float(group), 1.0)
    byte_of = pypto.floor(pypto.mul(col, 0.5))
    odd = pypto.sub(col, pypto.mul(byte_of, 2.0))
    off = pypto.add(pypto.mul(odd, float(TABLE_SPAN)), 128.0)
    byte_of = pypto.cast(byte_of, pypto.DT_INT32)
    pypto.set_vec_tile_shapes(1, group)
    return byte_of, pypto.reshape(off, [1, group])


def group_slots(pypto, ids, keys, groups, key_of, fp32_rows, t):
    """``(safe, slot)``: INT32 ``[keys]`` row ids ``max(id, 0)`` and INT32 ``[keys * groups]``
    slot ``safe * groups + lane`` of every group, in 1-D tiles of ``t``.  The lane comes from
    an ``arange`` in the tile: a loop-invariant lane tensor would be copied in again for
    every tile."""
    n = keys * groups
    pypto.set_vec_tile_shapes(1, keys)
    safe = pypto.reshape(pypto.maximum(ids, 0), [keys])
    pypto.set_vec_tile_shapes(t)
    iota = pypto.arange(0.0, float(n), 1.0)
    lane = pypto.sub(iota, pypto.mul(pypto.floor(pypto.mul(pypto.add(iota, 0.5), 1.0 / groups)),
                                     float(groups)))
    if fp32_rows:  # deliberately wrong: the slot in FP32
        srep = pypto.index_select(pypto.cast(safe, pypto.DT_FP32), 0, key_of)
        return safe, pypto.cast(pypto.add(pypto.mul(srep, float(groups)), lane), pypto.DT_INT32)
    return safe, pypto.add(pypto.mul(pypto.index_select(safe, 0, key_of), groups),
                           pypto.cast(lane, pypto.DT_INT32))


def scale_bytes(pypto, ids, keys, groups, key_of, scales, fp32_rows):
    """``(slot, scale bytes)`` INT32 / uint8 ``[keys * groups]``: the slots and the 1-D gather
    of the flat scale table, in one tile and outside the decode's forced subgraph.  Inside
    it, the gather fails pypto 0.2.0's TuneSyncForVF pass (``Cannot find GATHER in
    PIPE_MTE2``) once the scale table passes about 29 KB (a FLASH index-key cache of 60
    blocks); a ``[rows, 1]`` view fails other sizes; forced into a subgraph of its own, it
    fails at every size; left to the partitioner in decode-sized tiles, it becomes many
    small tasks (FLASH TP4 T=192 sparse_attention 1,302 us against 448)."""
    n = keys * groups
    tile = min(n, 2 * TILE_ELEMS)
    _, slot = group_slots(pypto, ids, keys, groups, key_of, fp32_rows, tile)
    pypto.set_vec_tile_shapes(tile)
    return slot, pypto.index_select(scales, 0, slot)


def _codes_index(pypto, codes):
    """INT32 table index ``code + 128`` of uint8 ``codes`` (read signed or unsigned)."""
    return pypto.cast(pypto.add(pypto.cast(codes, pypto.DT_FP32), 128.0), pypto.DT_INT32)


def _result(pypto, val, keys, d):
    """``val [n, group]`` as BF16 ``[keys, d]`` (a reshape of whole rows)."""
    pypto.set_vec_tile_shapes(min(keys, 16), d)
    return pypto.reshape(val, [keys, d])


def window_keys(pypto, ids, payload, scales, table, key_of, keys, d, group, *,
                fp32_rows=False):
    """BF16 ``[keys, d]``: the MXFP8 window rows named by INT32 ``ids [1, keys]`` (-1: row 0
    is read; the caller masks it).  ``payload`` uint8 ``[rows * d/group, group]`` E4M3
    codes, ``scales`` uint8 ``[rows * d/group]`` E8M0 codes (GM reshapes of the cache),
    ``table`` from :func:`v41.mx_decode.e4m3_table`, ``key_of`` from
    :func:`slot_constants`."""
    g = d // group
    n, t = keys * g, min(keys * g, group_rows(group))
    slot, sc = scale_bytes(pypto, ids, keys, g, key_of, scales, fp32_rows)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(t)
        pw = mx_decode.e8m0_pow2(pypto, sc)
        pypto.set_vec_tile_shapes(t, 1)
        pw = pypto.reshape(pw, [n, 1])
        pypto.set_vec_tile_shapes(t, group)
        idx = _codes_index(pypto, pypto.index_select(payload, 0, slot))
        pypto.set_vec_tile_shapes(t * group)
        val = pypto.index_select(table, 0, pypto.reshape(idx, [n * group]))
        pypto.set_vec_tile_shapes(t, group)
        val = pypto.cast(pypto.mul(pypto.reshape(val, [n, group]), pw), pypto.DT_BF16)
        return _result(pypto, val, keys, d)


def fp4_keys(pypto, ids, payload, scales, table, key_of, nibbles, keys, d, group, *,
             scale_e8m0=False, fp32_rows=False):
    """BF16 ``[keys, d]``: the MXFP4 rows named by INT32 ``ids [1, keys]``.  ``payload``
    uint8 ``[rows * d/group, group/2]`` packed E2M1 pairs, ``scales`` uint8 ``[rows *
    d/group]`` scale codes: E4M3 (compressed KV) or, with ``scale_e8m0``, E8M0 (index keys);
    ``table`` from :func:`nibble_table`, ``nibbles`` from :func:`nibble_constants`."""
    g = d // group
    n, t = keys * g, min(keys * g, group_rows(group))
    byte_of, offset = nibbles
    slot, sc = scale_bytes(pypto, ids, keys, g, key_of, scales, fp32_rows)
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(t)
        if scale_e8m0:
            sv = mx_decode.e8m0_pow2(pypto, sc)
        else:
            # arithmetic, not a table gather: a gather indexed by the gathered scale bytes
            # fails pypto 0.2.0's TuneSyncForVF pass once the slots span several tiles
            sv = mx_decode.e4m3_values(pypto, mx_decode.unsigned_codes(pypto, sc))
        pypto.set_vec_tile_shapes(t, 1)
        sv = pypto.reshape(sv, [n, 1])
        pypto.set_vec_tile_shapes(t, group)
        packed = pypto.index_select(payload, 0, slot)  # [n, group/2]
        b = pypto.cast(pypto.index_select(packed, 1, byte_of), pypto.DT_FP32)  # [n, group]
        idx = pypto.cast(pypto.add(b, pypto.expand_clone(offset, [n, group])), pypto.DT_INT32)
        pypto.set_vec_tile_shapes(t * group)
        val = pypto.index_select(table, 0, pypto.reshape(idx, [n * group]))
        pypto.set_vec_tile_shapes(t, group)
        val = pypto.cast(pypto.mul(pypto.reshape(val, [n, group]), sv), pypto.DT_BF16)
        return _result(pypto, val, keys, d)
