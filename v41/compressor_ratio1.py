"""Ratio-1 compressor (C1A Full): latent, compressed KV and index-key publication (golden:
``goldens.compressor.compress_and_publish`` with ``ratio=1``).

Per valid token ``t < num_tokens``: ``latent = RMSNorm(bf16(x @ wkv), norm)`` [BF16] (cube
matmul, FP32 accumulation; FP32 row statistic), then, when ``position_ids[t] >= 0`` and
``compressed_slots[t] >= 0``, publication at compressed position ``p`` (ratio 1: the
token's own position) through :func:`v41.compressor_common.encode_tile`: MXFP4 g16 / E4M3
compressed KV of ``RoPE(latent)``, MXFP4 g32 / E8M0 index key of
``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))``, written at physical row
``slot = block * block_size + offset`` of the four caches.  Rows ``t >= num_tokens`` are
never read (the loop covers only the tiles below the runtime ``num_tokens``; the last
tile's ``valid_shape`` stops there); ``num_tokens = 0`` reads and writes nothing.  Slot
ranges, duplicates, RoPE capacity and the metadata are host checks
(``harness.entries.compressor_ratio1.validate_launch``).

ABI
---
===================  =================================  ========  =====
name                 shape                              dtype     role
===================  =================================  ========  =====
x                    (tokens, hidden)                   bfloat16  in
wkv                  (hidden, head_dim)                 bfloat16  in
norm                 (head_dim,)                        float32   in
index_wk             (head_dim, index_dim)              bfloat16  in
index_norm           (index_dim,)                       float32   in
freqs_cos            (capacity, half)                   float32   in
freqs_sin            (capacity, half)                   float32   in
position_ids         (tokens,)                          int32     in
compressed_slots     (tokens,)                          int32     in
num_tokens           (1,)                               int32     in
compressed_kv        (blocks, block_size, 1, head_dim/2)  uint8   inout  (E2M1 pairs)
compressed_kv_scale  (blocks, block_size, 1, kv_groups)   uint8   inout  (E4M3 codes)
index_key            (blocks, block_size, 1, index_dim/2) uint8   inout  (E2M1 pairs)
index_key_scale      (blocks, block_size, 1, ik_groups)   uint8   inout  (E8M0 codes)
===================  =================================  ========  =====

``tokens`` from ``case["tokens"]`` (dynamic); ``capacity`` and ``blocks`` from the case
(``case["capacity"]``, ``case["blocks"]``).  ``compressed_slots`` is INT32 (the caller
narrows ``ForwardMetadata.compressed_slots`` after its range check; pypto reads scalars
from INT32 tensors only); ``compressed_kv_scale`` carries the E4M3 bytes as uint8.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.compressor_common import encode_tile, rms_norm_rows
from v41.cube_tiles import row_tile

ROW_TILE = 8  # tokens per loop iteration (one cube M tile of 16)
# A launch of more than BIG_ROWS_FROM tokens with a wkv of at least BIG_WEIGHT_BYTES takes
# row tiles of its tokens rounded up to 16, at most ROWS_MAX, as one cube M tile: the row
# tile trades wkv's re-reads (once per row tile and N tile) against the static tile's vector
# work.  FLASH (wkv 5 MiB) T=192 392 -> 197 us, T=40 113 -> 97 us; but T=16 70 -> 83 us,
# T=4 69 -> 79 us with 16 rows, and TINY (wkv 32 KiB) T=40 38 -> 57 us.
ROWS_MAX = 64
BIG_ROWS_FROM = 32
BIG_WEIGHT_BYTES = 1 << 20

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "index_from_rotated": "derives the index key from the ROTATED latent",
    "fp4_toward_zero": "rounds E2M1 codes toward zero instead of to nearest even",
    "negative_positions_publish": "publishes rows with a negative position when their slot "
                                  "is >= 0 (the golden leaves such rows inert)",
}

ABI = (
    Arg("x", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("wkv", ("hidden", "head_dim"), "bfloat16", "in"),
    Arg("norm", ("head_dim",), "float32", "in"),
    Arg("index_wk", ("head_dim", "index_dim"), "bfloat16", "in"),
    Arg("index_norm", ("index_dim",), "float32", "in"),
    Arg("freqs_cos", ("capacity", "half"), "float32", "in"),
    Arg("freqs_sin", ("capacity", "half"), "float32", "in"),
    Arg("position_ids", ("tokens",), "int32", "in"),
    Arg("compressed_slots", ("tokens",), "int32", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("compressed_kv", ("blocks", "block_size", 1, "kv_bytes"), "uint8", "inout"),
    Arg("compressed_kv_scale", ("blocks", "block_size", 1, "kv_groups"), "uint8", "inout"),
    Arg("index_key", ("blocks", "block_size", 1, "ik_bytes"), "uint8", "inout"),
    Arg("index_key_scale", ("blocks", "block_size", 1, "ik_groups"), "uint8", "inout"),
)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    case = case or {}
    c = config.cache
    d, di, rd = config.head_dim, config.index.head_dim, config.rope_dim
    for name, width, group in (("config.head_dim", d, c.compressed_group),
                               ("config.index.head_dim", di, c.index_group)):
        if width % group or (width - rd) % group or width < rd:
            raise ValueError(f"{name}: {width} (nope part {width - rd}) must be a multiple of "
                             f"group {group} and at least rope_dim {rd}")
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": config.hidden_size,
            "head_dim": d, "index_dim": di, "rope_dim": rd, "half": rd // 2,
            "capacity": case_int(case, "capacity", minimum=1),
            "blocks": case_int(case, "blocks", minimum=1), "block_size": c.block_size,
            "kv_bytes": d // 2, "kv_groups": d // c.compressed_group, "kv_group": c.compressed_group,
            "ik_bytes": di // 2, "ik_groups": di // c.index_group, "ik_group": c.index_group}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``compressor_ratio1(x, wkv, norm, index_wk, index_norm, freqs_cos,
    freqs_sin, position_ids, compressed_slots, num_tokens, compressed_kv,
    compressed_kv_scale, index_key, index_key_scale)`` (capacity and blocks fixed, tokens
    dynamic)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {})
    hidden, d, di, half = dm["hidden"], dm["head_dim"], dm["index_dim"], dm["half"]
    cap, blocks, bs = dm["capacity"], dm["blocks"], dm["block_size"]
    kvb, kvg, ikb, ikg = dm["kv_bytes"], dm["kv_groups"], dm["ik_bytes"], dm["ik_groups"]
    eps = float(config.rms_norm_eps)
    tokens_hint = dm["tokens"]
    big = tokens_hint > BIG_ROWS_FROM and hidden * d * 2 >= BIG_WEIGHT_BYTES
    rows = row_tile(tokens_hint, ROWS_MAX) if big else ROW_TILE
    m_tile = max(rows, 16)
    switches = frozenset({variant})
    lowest_pos = -(2 ** 30) if variant == "negative_positions_publish" else 0
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def compressor_ratio1(
        x: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        wkv: pypto.Tensor([hidden, d], pypto.DT_BF16),
        norm: pypto.Tensor([d], pypto.DT_FP32),
        index_wk: pypto.Tensor([d, di], pypto.DT_BF16),
        index_norm: pypto.Tensor([di], pypto.DT_FP32),
        freqs_cos: pypto.Tensor([cap, half], pypto.DT_FP32),
        freqs_sin: pypto.Tensor([cap, half], pypto.DT_FP32),
        position_ids: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        compressed_slots: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        compressed_kv: pypto.Tensor([blocks, bs, 1, kvb], pypto.DT_UINT8),
        compressed_kv_scale: pypto.Tensor([blocks, bs, 1, kvg], pypto.DT_UINT8),
        index_key: pypto.Tensor([blocks, bs, 1, ikb], pypto.DT_UINT8),
        index_key_scale: pypto.Tensor([blocks, bs, 1, ikg], pypto.DT_UINT8),
    ):
        active = num_tokens[0]
        pypto.set_vec_tile_shapes(1, d)
        norm32 = pypto.reshape(norm, [1, d])
        pypto.set_vec_tile_shapes(1, di)
        index_norm32 = pypto.reshape(index_norm, [1, di])
        pypto.set_cube_tile_shapes([m_tile, m_tile], [64, 256], [64, 256])
        for i in pypto.loop((active + rows - 1) // rows, name="C1_TILES", idx_name="i"):
            start = i * rows
            valid = (active - start).min(rows)
            pypto.set_vec_tile_shapes(min(rows, 8), min(hidden, 512))
            xt = pypto.view(x, [rows, hidden], [start, 0], valid_shape=[valid, hidden])
            kv32 = pypto.matmul(xt, wkv, pypto.DT_FP32)  # [rows, d]
            pypto.set_vec_tile_shapes(min(rows, 8), d)
            kv32 = pypto.cast(pypto.cast(kv32, pypto.DT_BF16), pypto.DT_FP32)
            latent = rms_norm_rows(pypto, kv32, norm32, rows, valid, d, eps)
            pypto.set_vec_tile_shapes(rows)
            pos = pypto.view(position_ids, [rows], [start], valid_shape=[valid])
            kv_p, kv_s, ik_p, ik_s = encode_tile(
                pypto, latent, pos, freqs_cos=freqs_cos, freqs_sin=freqs_sin,
                index_wk=index_wk, index_norm32=index_norm32, rows=rows, valid=valid,
                dims=dm, eps=eps, variant=switches)
            pypto.set_vec_tile_shapes(8, d)
            for r in pypto.loop(valid, name="C1_ROWS", idx_name="r"):
                slot = compressed_slots[start + r]
                p = position_ids[start + r]
                if slot >= 0:
                    if p >= lowest_pos:
                        at = [slot // bs, slot % bs, 0, 0]
                        pypto.assemble(pypto.reshape(pypto.view(kv_p, [1, kvb], [r, 0]),
                                                     [1, 1, 1, kvb]), at, compressed_kv)
                        pypto.assemble(pypto.reshape(pypto.view(kv_s, [1, kvg], [r, 0]),
                                                     [1, 1, 1, kvg]), at, compressed_kv_scale)
                        pypto.assemble(pypto.reshape(pypto.view(ik_p, [1, ikb], [r, 0]),
                                                     [1, 1, 1, ikb]), at, index_key)
                        pypto.assemble(pypto.reshape(pypto.view(ik_s, [1, ikg], [r, 0]),
                                                     [1, 1, 1, ikg]), at, index_key_scale)

    return compressor_ratio1
