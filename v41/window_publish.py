"""Window KV publication: quantize each token's BF16 KV row to MXFP8 and write it at its
slot of the paged sliding-window cache (golden: ``goldens.window_cache.publish_window_kv``).

Contract: token ``t`` with ``window_slots[t] >= 0`` writes its ``head_dim`` E4M3 codes and
``head_dim / 32`` E8M0 scale codes at physical row ``slot = block * block_size + offset``;
a negative slot writes nothing, and every other byte of both cache tensors is untouched.
Slots past the cache and two valid tokens naming one slot are host errors (the caller
validates before launch, ``harness.entries.window_publish.validate_launch``): the kernel
writes rows in token order, so a duplicate would silently keep the last token's row.

Quantization, per group of 32 channels, is the golden's MXFP8 rule computed with FP32
floor / min / max arithmetic (:func:`v41.mx_encode.quantize_tile`: E8M0 scale
``clamp(ceil(log2(amax / 448)), -127, 127)`` with an exact correction, E4M3 codes with
round-to-nearest-even and saturation at 448, the sign of -0.0 kept); codes are carried as
FP32 integers and cast to uint8 (exact for 0..255).

Rows are quantized ``row_tile`` (default ROW_TILE) tokens at a time; each row is then
written with one ``assemble`` per cache tensor at ``[slot // block_size, slot % block_size,
0, 0]`` under a runtime ``if slot >= 0`` (a reshaped view of an inout cache is not written
back, so the 4-D tensor is addressed directly; ``scatter_update`` takes no uint8).

Measured on a5sim: codes and scales equal the golden's bit for bit (the harness fixture's
hard rows and random BF16 bit patterns of every exponent).  Cost model (A5): FLASH T=192
~97 us, T=4096 ~1.7 ms (eight 512-token launches); about half is the per-row writes.

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
from v41.mx_encode import quantize_tile  # noqa: F401  (re-exported for callers)

ROW_TILE = 32  # tokens quantized per loop iteration

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


def build(config, case: dict | None = None, *, variant: str = "reference",
          row_tile: int = ROW_TILE, runtime_options: dict | None = None):
    """The jit kernel ``window_publish(kv, window_slots, window_kv, window_kv_scale)`` for
    ``config`` and ``case`` (blocks fixed, tokens dynamic)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"tokens": 1})
    d, g, blocks, bs = dm["head_dim"], dm["groups"], dm["blocks"], dm["block_size"]
    group = config.cache.window_group
    if isinstance(row_tile, bool) or not isinstance(row_tile, int) or row_tile < 1:
        raise ValueError(f"row_tile: must be an int >= 1, got {row_tile!r}")
    rows = row_tile
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
        for i in pypto.loop((tokens + rows - 1) // rows, name="WP_TILES", idx_name="i"):
            start = i * rows
            valid = (tokens - start).min(rows)
            pypto.set_vec_tile_shapes(min(rows, 8), d)
            x = pypto.view(kv, [rows, d], [start, 0], valid_shape=[valid, d])
            codes, scodes = quantize_tile(pypto, x, rows, valid, d, group, truncate=truncate,
                                          scale_shift=scale_shift)
            pypto.set_vec_tile_shapes(8, d)
            for r in pypto.loop(valid, name="WP_ROWS", idx_name="r"):
                slot = window_slots[start + r]
                if slot >= lowest:
                    row = slot.max(0)
                    pypto.assemble(pypto.reshape(pypto.view(codes, [1, d], [r, 0]), [1, 1, 1, d]),
                                   [row // bs, row % bs, 0, 0], window_kv)
                    pypto.assemble(pypto.reshape(pypto.view(scodes, [1, g], [r, 0]), [1, 1, 1, g]),
                                   [row // bs, row % bs, 0, 0], window_kv_scale)

    return window_publish
