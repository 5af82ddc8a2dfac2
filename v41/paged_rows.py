"""Trace-time gathers of key tiles from a paged cache by physical row id, shared by the
kernels that read the window, compressed or index-key caches (sparse attention, paged
indexer).

A row id is ``block * block_size + offset`` (-1 = no key).  ``index_select`` aborts on -1,
so rows are gathered at ``max(id, 0)`` and a -1 key gets the FP32 bias ``-MASK_BIAS`` from
``(clip(id + 1, 0, 1) - 1) * MASK_BIAS``.  Scale bytes are gathered one by one from the
flat scale table at ``row * groups + lane`` in INT32 (an FP32 row index is wrong past
2^24 slots; ``fp32_rows`` keeps that arithmetic for the deliberately wrong variant).
"""

MASK_BIAS = 1.0e30  # added (negated) to the logits of -1 keys


def scale_slots(pypto, tile, groups, fp32_rows=False):
    """``(rep_idx, lane)`` INT32 ``[tile * groups]``: the key and the group of each flat scale
    slot of a key tile (small numbers: exact through FP32; ``lane`` stays FP32 for the
    ``fp32_row_index`` variant)."""
    pypto.set_vec_tile_shapes(tile * groups)
    iota = pypto.arange(0.0, float(tile * groups), 1.0)
    key_of = pypto.floor(pypto.mul(iota, 1.0 / groups))
    lane = pypto.sub(iota, pypto.mul(key_of, float(groups)))
    if fp32_rows:
        return pypto.cast(key_of, pypto.DT_INT32), lane
    return pypto.cast(key_of, pypto.DT_INT32), pypto.cast(lane, pypto.DT_INT32)


def gather_tile(pypto, ids, tile, payload, scales, slots, groups, row_shape, fp32_rows):
    """``(payload rows, flat scale bytes, FP32 mask bias [1, tile])`` of one key tile of INT32
    row ids ``ids [1, tile]`` (-1 padded)."""
    rep_idx, lane = slots
    pypto.set_vec_tile_shapes(1, tile)
    safe = pypto.reshape(pypto.maximum(ids, 0), [tile])
    bias = pypto.mul(pypto.sub(pypto.clip(pypto.add(pypto.cast(ids, pypto.DT_FP32), 1.0),
                                          0.0, 1.0), 1.0), MASK_BIAS)
    pypto.set_vec_tile_shapes(*row_shape)
    rows = pypto.index_select(payload, 0, safe)
    # scale rows are a few bytes: gather single bytes of the flat table at row*groups+lane
    pypto.set_vec_tile_shapes(tile * groups)
    if fp32_rows:
        srep = pypto.index_select(pypto.cast(safe, pypto.DT_FP32), 0, rep_idx)
        slot = pypto.cast(pypto.add(pypto.mul(srep, float(groups)), lane), pypto.DT_INT32)
    else:
        srep = pypto.index_select(safe, 0, rep_idx)
        slot = pypto.add(pypto.mul(srep, groups), lane)
    return rows, pypto.index_select(scales, 0, slot), bias
