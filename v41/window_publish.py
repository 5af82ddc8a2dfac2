"""Window KV publication: quantize each token's BF16 KV row to MXFP8 and write it at its
slot of the paged sliding-window cache (golden: ``goldens.window_cache.publish_window_kv``).

Contract: token ``t`` with ``window_slots[t] >= 0`` writes its ``head_dim`` E4M3 codes and
``head_dim / 32`` E8M0 scale codes at physical row ``slot = block * block_size + offset``;
a negative slot writes nothing, and every other byte of both cache tensors is untouched.
Slots past the cache and two valid tokens naming one slot are host errors (the caller
validates before launch, ``harness.entries.window_publish.validate_launch``): the rows are
written by parallel tasks, so a duplicate would silently keep either token's row.

Quantization, per group of 32 channels, is the golden's MXFP8 rule computed with FP32
floor / min / max arithmetic (:func:`v41.mx_encode.quantize_tile`: E8M0 scale
``clamp(ceil(log2(amax / 448)), -127, 127)`` with an exact correction, E4M3 codes with
round-to-nearest-even and saturation at 448, the sign of -0.0 kept); codes are carried as
FP32 integers and cast to uint8 (exact for 0..255).

Schedule: the launch's tokens in tiles of ``rows``, one loop iteration per tile, and the
whole iteration -- BF16 load, quantization, every row's write -- is ONE task
(:func:`v41.subgraph.one_subgraph`, entered in a module-level function: the jit parser
refuses a ``with`` in the kernel body).
``rows`` is picked at run time from ROW_TILES (1, 2, 4, 8, 16, 37): the smallest that keeps
the launch to at most VECTOR_CORES (56) tasks, one wave, and 37 past 896 tokens (T=4096:
two full waves of 111 tasks); each tile size is its own branch of the compiled program
(``build(row_tiles=..., wave=...)`` shrinks them for tests).  Each row is written by its own ``assemble`` at ``[slot //
block_size, slot % block_size, 0, 0]``, unrolled over the tile at trace time.  Instead of a
runtime ``if slot >= 0`` (whose branch was a function of two copy tasks per row, each
waiting ~9 k cycles on the quantization's tasks), the row's view carries a runtime valid
row count ``live`` (1 for a valid slot of a real row, else 0) and an ``assemble`` of a
zero-row view writes nothing (``tests/platforms/test_a5sim_zero_row_assemble.py``).  Rows
past the launch's tokens read the last token's slot (in bounds) and are never live.  The
uint8 casts are one ``[1, 1, 1, width]`` cast per row of a ``[rows, 1, 1, width]`` tile, so
a row leaves the vector buffer by one copy-out into the 4-D cache (a per-row reshape of a
2-D tile went to global memory and back, ~1,400 cycles of copy-in per row; views of a
tensor already cast whole became a copy task per row).  A reshaped view of the inout cache
is not written back, so the 4-D tensor is addressed directly; ``scatter_update`` takes no
uint8 and, on the interpreter, stops at the first out-of-range (negative) index.

Cost model (A5, FLASH), before -> after: T=192 97.2 -> 6.3 us (48 tasks of 4 rows; each
~9.9 k cycles: 1.4 k BF16 copy-in, ~7 k of the encoder's vector operations, 1.4 k of casts
and row copy-outs), T=4 33.0 -> 3.2 us, T=48 -> 3.6 us (one row per task), T=4096 1.73 ms
-> 179 us as eight 512-token launches (32 tasks of 16 rows each); as one launch (the
harness's estimate-only platform, ``launch_step``) 136.5 us: 256 tasks of 16 rows, ~36 k
cycles each (vector ~27 k, SUB [64, 32] 325 cycles against 73 for MUL; 33 copy-outs of
~310 cycles), 4.6 waves of which the AICPU's dispatch left some cores a wave idle.
Measured one-launch T=4096 tiles: 37 rows (two waves) 98.8 us; 32 rows 125.7; 25 rows
141.1; 74 rows (one wave) 139.5, 48 rows per task and more spill the FP32 codes (each row's
cast copies the whole tile back in), 40 rows do not.  Then the encoder without
tensor-tensor SUBs and with the RNE as ``(y + 2^23) - 2^23`` (:mod:`v41.mx_encode`, same
bits): T=192 6.3 -> 4.8 us, T=4 3.2 -> 2.8 us, T=4096 with 37-row tiles 57.5 us (111 tasks
of ~48.7 k cycles: vector ~26.4 k, 74 per-row copy-outs ~22 k; vector cores 93 % busy),
with 16 / 24 / 32 / 40 / 48 / 74 rows (before the scale-tile change) 102.0 / 96.6 / 92.1
/ 76.1 / 149.7 (spill) / 115.9 us.  One fixed tile
instead: 4 rows gave T=4 5.5 us; 1 row gave T=192 25.5 us (four waves).  Measured on
a5sim: codes and scales equal the golden's bit for bit (the harness fixture's hard rows and
random BF16 bit patterns of every exponent).

ABI
---
=================  ===================================  ========  =====
name               shape                                dtype     role
=================  ===================================  ========  =====
kv                 (tokens, head_dim)                   bfloat16  in
window_slots       (tokens,)                            int32     in
window_kv          (blocks, block_size, 1, head_dim)    uint8     inout  (E4M3 codes)
window_kv_scale    (blocks, block_size, 1, groups)      uint8     inout  (E8M0 codes)
=================  ===================================  ========  =====

The payload is carried as uint8 bytes (the harness views them as ``float8_e4m3fn`` for the
golden); ``window_slots`` is INT32 (``ForwardMetadata.window_slots`` is INT64: the caller
narrows it after its range check; pypto reads scalars from INT32 tensors only).
``tokens`` from ``case["tokens"]`` (a dynamic axis); ``groups = head_dim / window_group``;
``blocks`` from ``case["blocks"]`` when given, else :func:`default_blocks` (from
``case["tokens"]`` and ``case["requests"]``).
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.mx_encode import group_codes, quantize_tile  # noqa: F401  (quantize_tile re-exported)
from v41.subgraph import one_subgraph

# tokens per loop iteration (one task), picked at run time; the last serves every launch
# past 56 x 16 tokens (37 rows: T=4096 is two full waves of 111 tasks)
ROW_TILES = (1, 2, 4, 8, 16, 37)
VECTOR_CORES = 56  # A5 vector cores: a launch of <= 56 x tile tokens is one wave of tasks

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "negative_to_row0": "a negative slot writes its row at physical row 0 instead of nothing",
    "truncate": "E4M3 mantissa truncated toward zero instead of rounded to nearest even",
    "scale_off_by_one": "stores scale code e + 128 (one binade too large) for a payload "
                        "quantized with e",
}

ABI = (
    Arg("kv", ("tokens", "head_dim"), "bfloat16", "in"),
    Arg("window_slots", ("tokens",), "int32", "in"),
    Arg("window_kv", ("blocks", "block_size", 1, "head_dim"), "uint8", "inout"),
    Arg("window_kv_scale", ("blocks", "block_size", 1, "groups"), "uint8", "inout"),
)


def default_blocks(config, tokens: int, requests: int = 1) -> int:
    """Cache blocks when a case names none: room for ``tokens`` rows spread over
    ``requests`` requests that each start inside a page (two partial pages per request),
    plus two spare blocks; at least 4."""
    return max(4, -(-tokens // config.cache.block_size) + 2 * requests + 2)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    case = case or {}
    tokens = case_int(case, "tokens", minimum=1)
    d, group = config.head_dim, config.cache.window_group
    if d % group:
        raise ValueError(f"config.head_dim: {d} is not a multiple of window_group {group}")
    requests = case_int(case, "requests", 1, minimum=1)
    blocks = case_int(case, "blocks", default_blocks(config, tokens, requests), minimum=1)
    return {"tokens": tokens, "head_dim": d, "groups": d // group, "blocks": blocks,
            "block_size": config.cache.block_size}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def quantize_rows(pypto, x, rows, valid, d, group, *, truncate=False, scale_shift=0.0):
    """FP32 ``(codes [rows, 1, 1, d], scale codes [rows, 1, 1, d / group])`` of a BF16 tile
    whose first ``valid`` rows are real: :func:`v41.mx_encode.group_codes` reshaped to the
    cache's 4-D row layout before the uint8 casts, which the caller does per row
    (module-level: runs at trace time)."""
    gpr = d // group  # groups per row
    codes, scode = group_codes(pypto, x, rows, valid, d, group, truncate=truncate,
                               scale_shift=scale_shift)
    pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, d)
    codes = pypto.reshape(codes, [rows, 1, 1, d], valid_shape=[valid, 1, 1, d])
    pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, max(gpr, 32))  # >= one 32-byte uint8 block
    scodes = pypto.reshape(scode, [rows, 1, 1, gpr], valid_shape=[valid, 1, 1, gpr])
    return codes, scodes


def publish_tile(pypto, kv, window_slots, window_kv, window_kv_scale, i, rows, tokens, lowest,
                 group, truncate, scale_shift):
    """Tile ``i`` of ``rows`` tokens: quantize, then write each live row; one task
    (:func:`v41.subgraph.one_subgraph`).  Module-level: runs at trace time."""
    d = kv.shape[1]
    bs, g = window_kv.shape[1], window_kv_scale.shape[3]
    with one_subgraph(pypto):
        start = i * rows
        valid = (tokens - start).min(rows)
        pypto.set_vec_tile_shapes(min(rows, 8), d)
        x = pypto.view(kv, [rows, d], [start, 0], valid_shape=[valid, d])
        codes, scodes = quantize_rows(pypto, x, rows, valid, d, group, truncate=truncate,
                                      scale_shift=scale_shift)
        for r in range(rows):  # trace-time unroll over the tile's rows
            slot = window_slots[(start + r).min(tokens - 1)]  # past the tokens: never live
            # 1 for a slot >= lowest of a real row, else 0: a zero-row view writes nothing
            live = (slot - lowest + 1).max(0).min(1).min((valid - r).max(0))
            row = slot.max(0)
            at = [row // bs, row % bs, 0, 0]
            pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, d)
            pypto.assemble(pypto.cast(pypto.view(codes, [1, 1, 1, d], [r, 0, 0, 0],
                                                 valid_shape=[live, 1, 1, d]), pypto.DT_UINT8),
                           at, window_kv)
            pypto.set_vec_tile_shapes(min(rows, 8), 1, 1, max(g, 32))
            pypto.assemble(pypto.cast(pypto.view(scodes, [1, 1, 1, g], [r, 0, 0, 0],
                                                 valid_shape=[live, 1, 1, g]), pypto.DT_UINT8),
                           at, window_kv_scale)


def publish_rows(pypto, kv, window_slots, window_kv, window_kv_scale, tokens, lowest, group,
                 truncate, scale_shift, rows):
    """The launch's tokens in tiles of ``rows``: one loop iteration (one task) per tile."""
    for i in pypto.loop((tokens + rows - 1) // rows, name=f"WP_ROWS{rows}", idx_name="i"):
        publish_tile(pypto, kv, window_slots, window_kv, window_kv_scale, i, rows, tokens,
                     lowest, group, truncate, scale_shift)


def build(config, case: dict | None = None, *, variant: str = "reference",
          row_tiles: tuple = ROW_TILES, wave: int = VECTOR_CORES,
          runtime_options: dict | None = None):
    """The jit kernel ``window_publish(kv, window_slots, window_kv, window_kv_scale)`` for
    ``config`` and ``case`` (blocks fixed, tokens dynamic).  ``row_tiles`` (six ints) and
    ``wave`` (tasks a wave) pick each launch's row tile; tests shrink them so a small launch
    runs several partial tiles."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"tokens": 1})
    d, g, blocks, bs = dm["head_dim"], dm["groups"], dm["blocks"], dm["block_size"]
    group = config.cache.window_group
    tiles = tuple(row_tiles)
    if len(tiles) != 6 or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                              for t in tiles):
        raise ValueError(f"row_tiles: must be six ints >= 1, got {row_tiles!r}")
    if isinstance(wave, bool) or not isinstance(wave, int) or wave < 1:
        raise ValueError(f"wave: must be an int >= 1, got {wave!r}")
    ta, tb, tc, td, te, tf = tiles
    lowest = 0 if variant != "negative_to_row0" else -(2 ** 30)  # smallest slot written
    truncate = variant == "truncate"
    scale_shift = 1.0 if variant == "scale_off_by_one" else 0.0
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def window_publish(
        kv: pypto.Tensor([tokens_dim, d], pypto.DT_BF16),
        window_slots: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        window_kv: pypto.Tensor([blocks, bs, 1, d], pypto.DT_UINT8),
        window_kv_scale: pypto.Tensor([blocks, bs, 1, g], pypto.DT_UINT8),
    ):
        tokens = kv.shape[0]
        args = (pypto, kv, window_slots, window_kv, window_kv_scale, tokens, lowest, group,
                truncate, scale_shift)
        # the smallest row tile that keeps the launch to one wave (a task per vector core)
        if tokens <= wave * ta:
            publish_rows(*args, ta)
        elif tokens <= wave * tb:
            publish_rows(*args, tb)
        elif tokens <= wave * tc:
            publish_rows(*args, tc)
        elif tokens <= wave * td:
            publish_rows(*args, td)
        elif tokens <= wave * te:
            publish_rows(*args, te)
        else:
            publish_rows(*args, tf)

    return window_publish
