"""Ratio-1 compressor (C1A Full): latent, compressed KV and index-key publication (golden:
``goldens.compressor.compress_and_publish`` with ``ratio=1``).

Per valid token ``t < num_tokens``: ``latent = RMSNorm(bf16(x @ wkv), norm)`` [BF16] (cube
matmul, FP32 accumulation; FP32 row statistic), then, when ``position_ids[t] >= 0`` and
``compressed_slots[t] >= 0``, publication at compressed position ``p`` (ratio 1: the
token's own position) with :func:`v41.compressor_common.publish_latent`'s arithmetic:
MXFP4 g16 / E4M3 compressed KV of ``RoPE(latent)``, MXFP4 g32 / E8M0 index key of
``RoPE(RMSNorm(bf16(latent @ index_wk), index_norm))``, written at physical row
``slot = block * block_size + offset`` of the four caches.  Rows ``t >= num_tokens`` are
never read (the loops cover only the tiles below the runtime ``num_tokens``; the last
tile's ``valid_shape`` stops there); ``num_tokens = 0`` reads and writes nothing.  Slot
ranges, duplicates, RoPE capacity and the metadata are host checks
(``harness.entries.compressor_ratio1.validate_launch``).

Schedule (the same traced program for every token count, so the compile time does not
follow the launch's tokens): the projection ``x @ wkv`` in row tiles of PROJ_ROWS tokens
(one cube M tile; ``x``'s whole row tile and ``wkv`` in K pieces of PROJ_K_B rows are the
L1 tiles), and inside each, tiles of ROW_TILE tokens, each as four tasks: the latent
(RMSNorm, one subgraph), the KV (RoPE, MXFP4, the rows' writes, one subgraph) in parallel
with the index projection (cube), then the index key (RMSNorm, RoPE, MXFP4, the rows'
writes, one subgraph); the last three are :func:`v41.compressor_common.publish_latent`,
shared with ratio 2.  A row is written by one ``assemble`` per cache of a view whose
runtime row count is 1 for a live row and 0 otherwise (a zero-row view writes nothing),
so the writes need no runtime ``if`` and stay inside their tile's task (the previous
kernel's per-row loop of four copy tasks was half its time).  Cost model (A5, FLASH)
before -> after: T=192 (180 active) 194.7 -> 48.5 us, T=2048 2,541.5 -> 508.8 us, T=4
68.9 -> 40.6 us, T=48 100.9 -> 42.8 us; the previous kernel picked its row tile from the
tokens (8 rows up to 32 tokens, 64 above), so its compile time followed them.

Bits: every FP32 value is the previous kernel's.  The interpreter sums a matmul in K
pieces of ``gcd(kL1A, kL1B)`` (256 here as before: L1 K tiles ``hidden`` and 768); the
projection's M (32) and the index projection's (8) are in the set of M for which torch's
FP32 rows equal M = 64's; the RoPE is computed over the whole row and selected per column
with ``where`` (the rotated columns by the same FP32 operations, the others the input
itself); the MXFP4 codes are :mod:`v41.mx_fp4`'s arithmetic, cast to uint8 per row.

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
import math

from v41.abi import Arg, case_int, jit_options, resolve
from v41.compressor_common import K_STEP, publish_latent, rms_norm_rows
from v41.cube_tiles import L1_BYTES
from v41.subgraph import one_subgraph

ROW_TILE = 8  # tokens per encode tile (four tasks); 16: FLASH T=192 55.9 us instead of 49.2
PROJ_ROWS = 32  # tokens per projection row tile; 64 (with L1 K tiles 256 / 2560): 60.7 us
PROJ_N = 128  # projection N tile; 64: FLASH T=192 60.5 us
PROJ_K_B = 768  # wkv's L1 K tile; x's is the whole hidden row

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


def _latent_stage(pypto, kv_all, j, rows, valid, norm, d, eps):
    """BF16 latent ``RMSNorm(bf16(x @ wkv))`` of tile ``j`` of a projection tile; one task."""
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(1, d)
        norm32 = pypto.reshape(norm, [1, d])
        pypto.set_vec_tile_shapes(rows, d)
        kv32 = pypto.view(kv_all, [rows, d], [j * rows, 0], valid_shape=[valid, d])
        kv32 = pypto.cast(pypto.cast(kv32, pypto.DT_BF16), pypto.DT_FP32)
        return rms_norm_rows(pypto, kv32, norm32, rows, valid, d, eps)


def _encode_publish(pypto, kv_all, j, rows, pvalid, pstart, active, x_args, dm, eps, lowest,
                    switches):
    """Encode tile ``j`` of a projection tile: KV stage, index projection, key stage."""
    norm = x_args[2]
    start = pstart + j * rows
    valid = (pvalid - j * rows).min(rows)
    latent = _latent_stage(pypto, kv_all, j, rows, valid, norm, dm["head_dim"], eps)
    publish_latent(pypto, latent, rows, valid, start, active, x_args, dm, eps, lowest,
                   switches)


def projection_k_tiles(hidden: int) -> list:
    """``[k0, kL1A, kL1B]`` of the projection: x's whole row tile and wkv in PROJ_K_B-row
    pieces when both fit L1 and the interpreter's K piece ``gcd(kL1A, kL1B)`` stays
    K_STEP (or the whole K when ``hidden`` is at most K_STEP); else K_STEP pieces of both."""
    fits = (PROJ_ROWS * hidden + PROJ_K_B * PROJ_N) * 2 <= L1_BYTES
    same_sums = hidden <= K_STEP or math.gcd(hidden, PROJ_K_B) == K_STEP
    if fits and same_sums and hidden % K_STEP == 0:
        return [64, hidden, PROJ_K_B]
    return [64, K_STEP, K_STEP]


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
    prow, rows = PROJ_ROWS, ROW_TILE
    k_tiles = projection_k_tiles(hidden)
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
        for i in pypto.loop((active + prow - 1) // prow, name="C1_PROJ", idx_name="i"):
            pstart = i * prow
            pvalid = (active - pstart).min(prow)
            pypto.set_vec_tile_shapes(min(prow, 8), min(hidden, 512))
            xt = pypto.view(x, [prow, hidden], [pstart, 0], valid_shape=[pvalid, hidden])
            pypto.set_cube_tile_shapes([prow, prow], k_tiles, [PROJ_N, PROJ_N])
            kv_all = pypto.matmul(xt, wkv, pypto.DT_FP32)  # [prow, d]
            for j in pypto.loop((pvalid + rows - 1) // rows, name="C1_TILES", idx_name="j"):
                _encode_publish(pypto, kv_all, j, rows, pvalid, pstart, active,
                                (position_ids, compressed_slots, norm, index_wk, index_norm,
                                 freqs_cos, freqs_sin, compressed_kv, compressed_kv_scale,
                                 index_key, index_key_scale), dm, eps, lowest_pos, switches)

    return compressor_ratio1
