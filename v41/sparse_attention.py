"""Sparse attention with the per-head sink over BOTH caches: window rows from the MXFP8
window cache and compressed rows from the packed MXFP4 compressed cache (golden:
``goldens.window_cache.gather_window_kv`` + ``goldens.sparse_attention.gather_compressed_kv``,
``concat_kv_parts`` then ``goldens.sparse_attention.sparse_attention``).

For token ``t`` and local head ``h`` over the rows ``k_j`` named by ``indices[t]`` (window)
then ``compressed_indices[t]`` (physical row ids ``block * block_size + offset`` in their
own cache; ``-1`` = no key)::

    l_j  = (q_th . k_j) * head_dim^-0.5                                 (FP32)
    o_th = sum_j exp(l_j - m) k_j / (exp(sink_h - m) + sum_j exp(l_j - m))

with V = K (the same latent rows), the sink in the denominator only, one BF16 cast: one
softmax over the window and compressed keys together.

Kernel algorithm (per token, all local heads at once):

* the keys come in parts: the window keys (one part of ``keys``) and the compressed keys
  (parts of ``KEY_TILE`` = 512, or fewer when the token has fewer).  Each part's rows are
  gathered by physical row id and decoded to BF16 (window: E4M3 x E8M0 per 32, compressed:
  packed E2M1 pairs, low nibble first, x E4M3 per 16; exact), the steps of
  :mod:`v41.kv_decode` in another layout: unforced steps gather the scale bytes (one scale
  group a slot; the parts' same-structure steps share one task); the decode, one subgraph,
  computes the scale values in 1-D tiles, reads whole cache rows in ``[32, d]`` tiles of
  whole keys, looks each code up in the value table (index ``code + 128``, INT16) and
  multiplies it by its group's scale, gathered from the part's scale values in global
  memory at a constant ``[keys, d]`` index (:func:`scale_index`).  A -1 id reads row 0
  (a -1 index aborts the interpreter's gather) and is masked below.  The FP8/FP4 dtypes
  are not used: the interpreter misdecodes FP8 exponent 15 and has no FP4.
* logits ``Q.K^T`` BF16 x BF16 -> FP32 on the cube, one product per part (per block of
  :func:`_pv_key_tile` keys in a larger part), times ``softmax_scale``; keys with a -1
  index get an FP32 bias ``(clip(idx+1, 0, 1) - 1) * 1e30`` (a sign test, exact for
  every INT32 id);
* one softmax over all the token's logits with the sink (FP32, one subgraph): ``m =
  max(sink, max_j l_j)``, ``p_j = exp(l_j - m)``, ``l = exp(sink - m) + sum_j p_j``, as
  the golden computes it.  A token without a valid key gives exactly 0.
* ``P.V`` as three BF16 products with FP32 accumulation, ``P = P_hi + P_mid + P_lo``
  (each the BF16 cast of what the previous terms leave; the remainders are exact, so the
  three terms hold all 24 bits of the FP32 probability): the probabilities are the
  golden's FP32 ones.  A single BF16 cast (~2^-9 relative per probability) fails the
  half-layer's row bound, 1.16x on decode SWA TINY: the o_proj MXFP8 activation
  quantization turns the small differences into rounding flips.  Two terms (~16 bits)
  still left 5-12 one-ulp output flips per rank at TINY, one of which crossed an MXFP8
  code and failed the reserved TP4 batch of C1A Reindex (row 29, 1.024x the RMS bound).
  The three terms are stacked into one ``[3h, n] x [n, d]`` product per part; the parts'
  products are summed over their stacks and added in order, divided by ``l`` and cast
  once to BF16 in one subgraph.

Schedule (A5 cost model): the AICPU charges each task and each dependency edge
(``resolveCycles`` 390), and with the pipes under 20 % busy that sets the time.  The
earlier kernel ran an online softmax over 64-key tiles with the arithmetic decoders of
:mod:`v41.mx_decode` in 32-row pieces: 55 tasks and 200 edges a token, TP4 T=192 2,207
us.  Whole parts (a scale-gather task and a decode task each), one softmax and one output
subgraph are about 10 tasks a token: 448 us, the outputs equal to the golden's as before
(the online rescaling steps are gone, so they differ from the earlier kernel's in FP32
reassociation only).

Past one wave of the vector cores (:data:`WAVE` = 56 tokens) the token loop takes two
tokens an iteration (past two waves three): the pair's same-structure subgraphs merge into
one task each (``vec_nbuffer_setting`` for the vector stages, ``cube_nbuffer_setting`` for
the products), 11 -> 5.5 tasks and 21 -> 13 edges a token.  The AICPU leaves a core idle
5-9 k cycles between two of its tasks, and with 11 tasks a token the pipes were 39 %
(vector) and 41 % (cube) busy: FLASH TP4 T=192 389.5 -> 290.7 us (2,117 -> 1,061 tasks,
both pipes 48 % busy), T=200 472.4 -> 373.6 us.  Below the wave nothing changes (T=4 80.2
us, TINY 41.1 us): pairs there halve the tasks the cores share (T=4 112.7 us, TINY 48.8
us).  The arithmetic of each token is unchanged (outputs bit for bit the same).

The decode in the group layout (``[1024, 16]`` tiles, one scale a tile row) spent its time
on copies to global memory: the scale values reshaped from 1-D to ``[n, 1]`` on chip
(copied out and in again per tile), the INT32 table index (a gather reads its index from
global memory), and the result reshaped to ``[keys, d]``.  Tiles of whole keys need no
reshape, the scale comes from a gather (the cost model charges a gather by its smallest
operand), and the index is INT16: the compressed decode went from 53.5 k to 42.9 k cycles
and FLASH TP4 T=192 from 448 to 390 us (T=200 534 -> 472 us; T=4 79.6 -> 80.2 us; TINY
40.8 -> 41.1 us), the outputs bit for bit the same.

Each decoded key was then written twice: the logits read ``[512, 256]`` column blocks of
the ``[512, 512]`` result, the ``P.V`` product ``[256, 512]`` row blocks, and pypto gave
each row block its own copy (an N tile of 256 in the ``P.V`` product instead fails to
compile: UB spill in the output subgraph, also with ``[3, 8, 256]`` vector tiles there).
The logits now take a part's keys in the ``P.V`` product's row blocks, one product per
block concatenated (each logit is the same dot product), and the pair's four block
products merge into one cube task (``cube_nbuffer_setting`` 4): the compressed decode
85.2 k -> 61.7 k cycles, FLASH TP4 T=192 290.7 -> 279.5 us (T=200 373.6 -> 357.6 us, T=48
124.4 -> 118.6 us, T=4 80.2 -> 75.3 us), outputs bit for bit the same.  The bound is now
the AICPU's dispatch in both halves of the launch (ready queues of 40-110 tasks while 17-35
of the 56 vector cores, later 21 of the 28 cube cores, are busy), and the cube's copy-in
of the decoded keys (each product reads all of them: 2 x 512 KB a token).  What is left
in the decode: the INT16 table index and the packed bytes still go through global memory
for their gathers (a ``[384, 2]`` table of both nibbles, one row gather a byte, pads its
``[n, 2]`` result to ``[n, 8]`` in UB and goes through global memory for the reshape to
``[keys, d]``: 85 k -> 221 k cycles).

The logits' tiles then followed the whole ``[512, d]`` part (``k1`` 256): each ``[256, d]``
block went to L1 in two copies, and the cube's copy-in charges 1,400 cycles a copy; with the
block's own tiles (``k1`` = d) the pair's logits took 30.2 k -> 22.7 k cycles (FLASH TP4
T=192 279.5 -> 265.9 us, T=48 118.6 -> 116.7 us).  The decode's table index is INT16
arithmetic on the gathered bytes (no FP32 tile), so past one wave its tiles take 64 keys
and the index goes to global memory in half the copies; with three tokens an iteration
past two waves, T=192 255.7 us (the cube then ~85 % busy from the middle of the launch on,
its ready queue 20-70 tasks deep: the AICPU's dispatch bounds it).  Outputs bit for bit the
same.

The constants built once before the loops each had an edge to one task of every iteration,
and the AICPU resolves a finished task's edges one at a time (390 cycles each) on the
AICPU that ran it: at FLASH TP4 T=192 the slot keys' task (130 edges, 50.7 k cycles) and
the nibble table's and nibble offsets' tasks (64 + 128 edges, 75 k cycles, on the same
AICPU as the E4M3 table's 64) released the scale tasks over 17 k-68 k cycles and the
compressed decodes over 68 k-118 k.  Those three are now built in the tasks that read them
(:func:`_scale_bytes`, :func:`_fp4_keys`; a few hundred cycles a task), and the scale
values are computed in the decode's subgraph (:func:`_scale_values`), so the window's and
the compressed part's scale-byte steps share one task: 11 -> 9 tasks per 3 tokens, FLASH
TP4 T=192 255.7 -> 232.3 us (709 -> 579 tasks; T=200 331.2 -> 299.4 us, T=48 116.9 ->
98.0 us, T=4 73.3 -> 63.3 us, TINY gate 41.1 / 43.1 / 43.0 -> 33.0 / 39.3 / 35.7 us).  The
E4M3 table stays before the loops (built in the window decode: 232.6 us).  What bounds it
now: the compressed decode (26.5 k cycles a token) is bound by its copies out of UB (the
BF16 keys in ``[32, d]`` tiles, the INT16 table index and the packed bytes go through
global memory for their gathers); the cube reads every decoded key twice (the logits and
``P.V``), 6.5 M cycles over 28 cores, 82 % busy from a third of the launch on.  Outputs bit
for bit the same.

Measured limit of that bound: with uniformly random E4M3 codes (log-uniform magnitudes)
a row's peak is ~16x its RMS, so one BF16 ulp of the output (a rounding flip caused by the
BF16 probabilities) exceeds ``5 % RMS(ref)``: FLASH TP4 T=48 K=192 failed ``row_peak`` at
1.23x the bound on 4/752 rows (the sink-12 head), reproduced bit for bit by a torch
emulation of this algorithm and gone when P stays FP32.  MX-published rows pass (0.58x).

Interpreter memory grows with tokens x keys: the harness splits large token counts into
host-side chunks, each its own launch of this kernel; the arithmetic per token is
unchanged.

Sinks must be finite (the golden also accepts +-inf; this kernel does not).  Row ids must
be -1 or inside their cache, and ``rows * groups`` of each cache must fit INT32 (the host
validates; an id past the cache aborts the gather).

ABI
---
===================  ====================================  ========  =====
name                 shape                                 dtype     role
===================  ====================================  ========  =====
q                    (tokens, heads, head_dim)             bfloat16  in
window_kv            (blocks, block_size, 1, head_dim)     uint8     in   (E4M3 codes)
window_kv_scale      (blocks, block_size, 1, groups)       uint8     in   (E8M0 codes)
indices              (tokens, keys)                        int32     in   (window rows)
compressed_kv        (cblocks, block_size, 1, head_dim/2)  uint8     in   (E2M1 pairs)
compressed_kv_scale  (cblocks, block_size, 1, cgroups)     uint8     in   (E4M3 codes)
compressed_indices   (tokens, ckeys)                       int32     in
attn_sink            (heads,)                              float32   in
out                  (tokens, heads, head_dim)             bfloat16  out
===================  ====================================  ========  =====

``tokens`` from ``case["tokens"]`` (a dynamic axis); ``heads = num_heads / case["tp"]``
(one TP rank's local heads); ``groups = head_dim / window_group``, ``cgroups = head_dim /
compressed_group``; ``keys`` / ``ckeys`` from ``case["keys"]`` / ``case["ckeys"]`` when
given, else :func:`default_keys` (FLASH 128 + 512); ``blocks`` / ``cblocks`` from the case
when given, else :func:`default_blocks` / :func:`default_cblocks`.  ``case["window_only"]``
(SWA, which has no compressed keys) builds the kernel without the compressed part: the
compressed inputs are not read, and the output equals that of every compressed id -1 bit
for bit (a masked key adds an exact 0 to every sum).
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41 import kv_decode, mx_decode
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import cube_tiles
from v41.subgraph import one_subgraph

KEY_TILE = 512  # keys per decode task (one task per part: the window's 128, the 512 Top-K)
MASK_BIAS = 1.0e30  # added (negated) to the logits of -1 keys
KEY_ALIGN = 16  # default key counts are rounded up to this (-1 padded)
INT32_MAX = 2 ** 31 - 1

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_sink": "ignores the sink (denominator without exp(sink - m))",
    "sink_numerator": "adds exp(sink - m) to every numerator element as well",
    "unmasked": "does not mask -1 keys (they attend to physical row 0)",
    "wrong_scale": "softmax scale head_dim^-1 instead of head_dim^-0.5",
    "no_compressed": "ignores the compressed part (window keys only)",
    "compressed_e8m0": "reads the compressed E4M3 scales as E8M0 codes",
    "nibble_swap": "unpacks the E2M1 pairs high nibble first",
    "fp32_row_index": "computes the flat scale slot row * groups + lane in FP32",
}

ABI = (
    Arg("q", ("tokens", "heads", "head_dim"), "bfloat16", "in"),
    Arg("window_kv", ("blocks", "block_size", 1, "head_dim"), "uint8", "in"),
    Arg("window_kv_scale", ("blocks", "block_size", 1, "groups"), "uint8", "in"),
    Arg("indices", ("tokens", "keys"), "int32", "in"),
    Arg("compressed_kv", ("cblocks", "block_size", 1, "half"), "uint8", "in"),
    Arg("compressed_kv_scale", ("cblocks", "block_size", 1, "cgroups"), "uint8", "in"),
    Arg("compressed_indices", ("tokens", "ckeys"), "int32", "in"),
    Arg("attn_sink", ("heads",), "float32", "in"),
    Arg("out", ("tokens", "heads", "head_dim"), "bfloat16", "out"),
)


def _align(n: int) -> int:
    return -(-n // KEY_ALIGN) * KEY_ALIGN


def default_keys(config) -> tuple[int, int]:
    """``(window keys, compressed keys)`` when a case names none: the sliding window and the
    indexer's Top-K, each rounded up to a multiple of 16 (FLASH 128 + 512, TINY 16 + 16)."""
    return _align(config.sliding_window), _align(config.index.topk)


def default_blocks(config, tokens: int) -> int:
    """Window cache blocks when a case names none: room for the window of ``tokens``
    consecutive positions plus two spare blocks (at least 4)."""
    bs = config.cache.block_size
    return max(4, -(-(config.sliding_window + tokens) // bs) + 2)


def default_cblocks(config, ckeys: int) -> int:
    """Compressed cache blocks when a case names none: ``ckeys`` rows plus two spare
    blocks (at least 4)."""
    return max(4, -(-ckeys // config.cache.block_size) + 2)


def key_tile(keys: int) -> int:
    return min(KEY_TILE, keys)


def _check_part(field: str, keys: int, scale_bytes: int) -> None:
    tile = key_tile(keys)
    if keys % tile or tile % 8:
        raise ValueError(f"case[{field!r}]: {keys} must be a multiple of {tile} and of 8")
    if tile * scale_bytes % 32:
        raise ValueError(f"case[{field!r}]: key tile {tile} x {scale_bytes} scale bytes is "
                         f"not a multiple of 32 bytes")


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    case = case or {}
    tokens = case_int(case, "tokens", minimum=1)
    tp = case_int(case, "tp", 1, minimum=1)
    if config.num_heads % tp:
        raise ValueError(f"case['tp']: num_heads {config.num_heads} is not divisible by {tp}")
    d, cc = config.head_dim, config.cache
    for name, grp in (("window_group", cc.window_group), ("compressed_group", cc.compressed_group)):
        if d % grp:
            raise ValueError(f"config.head_dim: {d} is not a multiple of {name} {grp}")
    g, cg = d // cc.window_group, d // cc.compressed_group
    wk, ck = default_keys(config)
    keys = case_int(case, "keys", wk, minimum=1)
    ckeys = case_int(case, "ckeys", ck, minimum=1)
    _check_part("keys", keys, g)
    _check_part("ckeys", ckeys, cg)
    blocks = case_int(case, "blocks", default_blocks(config, tokens), minimum=1)
    cblocks = case_int(case, "cblocks", default_cblocks(config, ckeys), minimum=1)
    for field, n, per in (("blocks", blocks, g), ("cblocks", cblocks, cg)):
        if n * cc.block_size * per > INT32_MAX:
            raise ValueError(f"case[{field!r}]: {n} blocks x {cc.block_size} rows x {per} scale "
                             f"slots exceeds the INT32 slot range {INT32_MAX}")
    return {"tokens": tokens, "window_only": int(bool(case.get("window_only"))),
            "heads": config.num_heads // tp, "head_dim": d, "half": d // 2,
            "groups": g, "cgroups": cg, "keys": keys, "ckeys": ckeys, "blocks": blocks,
            "cblocks": cblocks, "block_size": cc.block_size}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


# Merge up to 16 same-structure vector subgraphs of an iteration into one task: a part's
# whole-key decode tiles are independent, and the partitioner otherwise makes each its own
# task (FLASH TP4 T=192 1,675 us with 16 + 4 decode tasks a token; merging 8: 583 us, 32:
# 424 us, 16: 390 us).  Up to 6 cube ones: a group's logits in two key blocks a token
# (:func:`_pv_key_tile`; pairs: 2 287.3 us, 4 279.5 us; groups of 3 tokens: 6).
PASS_OPTIONS = {"vec_nbuffer_setting": {-2: 1, -1: 16}, "cube_nbuffer_setting": {-1: 6}}
# Past WAVE tokens (one wave of the 56 vector cores), the loop takes two tokens an
# iteration: the two tokens' same-structure subgraphs merge into one task each (vector by
# the setting above, cube by ``cube_nbuffer_setting``), which halves the tasks and the
# AICPU's per-task gaps.  FLASH TP4 T=192 389.5 -> 334.5 us with the vector merge alone,
# 290.7 us with the cube one; three tokens 289.0 us, four 306.2 us (and 7 s to compile);
# pairs from the first token cost T=4 80.2 -> 112.7 us and TINY 41.1 -> 48.8 us.  With the
# wide index tiles of :func:`_fp4_keys` (decode 61.7 k -> 54.4 k cycles a pair), three
# tokens an iteration past two waves (4 cube and 7 vector tasks per 3 tokens; on a core
# with a full ready queue the cube's tasks start 5.6 k cycles apart): T=192 263.8 -> 255.7
# us (four tokens: 262.1 us).  Triples from one wave on cost T=96 166.0 -> 190.4 us: the
# iterations all fit one wave there, and the longest sets the time.
WAVE = 56
SCALE_TILE = 8192  # 1-D tile of the scale values' steps (16,384: 396 us, 4,096: 414 us)
# Parts of at least this many keys compute their row ids with their scale slots (one task
# fewer a token: FLASH TP4 T=192 415 -> 390 us); smaller parts keep them apart (TINY 41.1
# us against 43.1 us together).
SHARED_ROWS_KEYS = 128


def _index_dtype(pypto):
    """Table indices (below 768) as INT16: the index tile goes through global memory
    for the gather, and the A5 cost model charges a copy by its bytes (FLASH TP4 T=192
    429 -> 418 us against INT32)."""
    return pypto.DT_INT16


SUM_ROWS = 16  # heads per vector tile of the softmax and the three-term P.V sum


def _pv_key_tile(h, n, d):
    """Keys per L1 block of a part's ``P.V`` product (its ``k1``).  The logits take the
    part's keys in blocks of this many rows, one product each, so both products read the
    decoded keys in the same ``[k1, d]`` row blocks and the decode writes each key once:
    with ``[512, 256]`` column blocks for the logits, pypto wrote every decoded key twice
    (the compressed decode 85.2 k -> 61.7 k cycles a pair).  The per-key dot products,
    and so the logits, are the same."""
    return cube_tiles(3 * h, n, d, 2)[1][1]


def _softmax_pv(pypto, qt, parts, sink, h, d, o):
    """``(products, m, l)`` of one token: one softmax over the logits of all ``parts``
    (``(keys [n_i, d] BF16, ids [1, n_i] INT32)``, in key order) with the sink in the
    denominator (max ``m`` and sum ``l`` FP32 ``[h, 1]``), and each part's ``P.V`` FP32
    ``[3h, d]`` with ``P`` split exactly into three BF16 terms stacked."""
    logits = []
    for kb, _ in parts:  # unrolled at trace time
        n = kb.shape[0]
        r = _pv_key_tile(h, n, d)
        if r < n and n % r == 0:  # in the P.V product's row blocks
            # tiles of the [r, d] block (k1 = d): one copy-in of each block, not two
            # (COPY_IN charges 1,400 cycles each; FLASH TP4 T=192 279.5 -> 265.9 us)
            pypto.set_cube_tile_shapes(*cube_tiles(h, d, r, 2))
            logits.append(pypto.concat([
                pypto.matmul(qt, pypto.view(kb, [r, d], [i * r, 0]), pypto.DT_FP32,
                             b_trans=True) for i in range(n // r)], 1))  # [h, n]
        else:
            pypto.set_cube_tile_shapes(*cube_tiles(h, d, n, 2))
            logits.append(pypto.matmul(qt, kb, pypto.DT_FP32, b_trans=True))  # [h, n]
    hv = min(h, SUM_ROWS)
    with one_subgraph(pypto):
        ss, mx = [], None
        for (kb, ids), s in zip(parts, logits):
            n = kb.shape[0]
            pypto.set_vec_tile_shapes(hv, n)
            s = pypto.mul(s, o["scale"])
            if o["mask"]:
                bias = _bias(pypto, ids, n)
                pypto.set_vec_tile_shapes(hv, n)  # the expand in whole [hv, n] tiles
                s = pypto.add(s, pypto.expand_clone(bias, [h, n]))
            ss.append(s)
            m = pypto.amax(s, -1, keepdim=True)
            mx = m if mx is None else pypto.maximum(mx, m)
        if o["use_sink"]:
            mx = pypto.maximum(mx, sink)
        l_run, p3s = None, []
        for s in ss:
            pypto.set_vec_tile_shapes(hv, s.shape[1])
            p = pypto.exp(pypto.sub(s, mx))
            ls = pypto.sum(p, -1, keepdim=True)
            l_run = ls if l_run is None else pypto.add(l_run, ls)
            p_hi = pypto.cast(p, pypto.DT_BF16)
            r_hi = pypto.sub(p, pypto.cast(p_hi, pypto.DT_FP32))  # exact
            p_mid = pypto.cast(r_hi, pypto.DT_BF16)
            p_lo = pypto.cast(pypto.sub(r_hi, pypto.cast(p_mid, pypto.DT_FP32)), pypto.DT_BF16)
            p3s.append(pypto.concat([p_hi, p_mid, p_lo], 0))  # [3h, n]
        pypto.set_vec_tile_shapes(hv, 8)
        if o["use_sink"]:
            l_run = pypto.add(l_run, pypto.exp(pypto.sub(sink, mx)))
    prods = []
    for (kb, _), p3 in zip(parts, p3s):
        pypto.set_cube_tile_shapes(*cube_tiles(3 * h, kb.shape[0], d, 2))
        prods.append(pypto.matmul(p3, kb, pypto.DT_FP32))  # [3h, d]
    return prods, mx, l_run


def _output(pypto, t, prods, mx, l_run, sink, out, h, d, o):
    """``out[t]`` = BF16 ``sum(P.V) / l``: the parts' three-term products summed over their
    stacks and added in order, divided, cast once and written, in one subgraph."""
    hv = min(h, SUM_ROWS)
    with one_subgraph(pypto):
        pv = None
        for prod in prods:
            pypto.set_vec_tile_shapes(3, hv, d)
            part = pypto.reshape(pypto.sum(pypto.reshape(prod, [3, h, d]), 0), [h, d])
            pypto.set_vec_tile_shapes(hv, d)
            pv = part if pv is None else pypto.add(pv, part)
        if o["sink_num"]:
            pv = pypto.add(pv, pypto.expand_clone(pypto.exp(pypto.sub(sink, mx)), [h, d]))
        o_t = pypto.cast(pypto.div(pv, l_run), pypto.DT_BF16)  # the one BF16 cast
        pypto.assemble(pypto.reshape(o_t, [1, h, d]), [t, 0, 0], out)


def _bias(pypto, ids, n):
    """FP32 ``[1, n]``: ``-MASK_BIAS`` where INT32 ``ids [1, n]`` is -1, else 0 (a sign test,
    exact for every INT32 id)."""
    pypto.set_vec_tile_shapes(1, n)
    return pypto.mul(pypto.sub(pypto.clip(pypto.add(pypto.cast(ids, pypto.DT_FP32), 1.0),
                                          0.0, 1.0), 1.0), MASK_BIAS)


def scale_index(pypto, keys, d, group):
    """INT32 ``[keys, d]``: entry ``(r, c)`` is ``r * (d/group) + c // group``, the position
    of element ``(r, c)``'s scale among a part's ``keys * d/group`` scale values (a gather
    index; build once, before the loops)."""
    total = keys * d
    pypto.set_vec_tile_shapes(min(total, kv_decode.TILE_ELEMS))
    iota = pypto.arange(0.0, float(total), 1.0)
    r = pypto.cast(pypto.floor(pypto.mul(pypto.add(iota, 0.5), 1.0 / group)), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(_key_rows(keys, d), d)
    return pypto.reshape(r, [keys, d])


def _key_rows(keys, d):
    """Keys per decode tile: ``[rows, d]`` FP32 tiles of :data:`v41.kv_decode.TILE_ELEMS`."""
    return max(1, min(keys, kv_decode.TILE_ELEMS // d))


def _scale_bytes(pypto, ids, keys, groups, scales, fp32_rows):
    """``(safe, codes)``: INT32 ``[keys]`` row ids ``max(id, 0)`` (the cache row each key
    reads; -1 reads row 0 and is masked by the caller) and uint8 ``[keys * groups]`` each
    group's scale byte from the 1-D gather of the flat scale table at the slots of
    :func:`v41.kv_decode.scale_bytes`, outside the decode's forced subgraph (whose pitfalls
    that function names).  The slots' key index (:func:`v41.kv_decode.slot_constants`) is
    built here, in the token's task: built once before the loops, its task had an edge to
    every scale task of the launch, resolved one at a time (see the module docstring).
    At FLASH the window's and the compressed part's steps have one structure and share a
    task."""
    n = keys * groups
    key_of = kv_decode.slot_constants(pypto, keys, groups)
    if keys < SHARED_ROWS_KEYS:
        _, sc = kv_decode.scale_bytes(pypto, ids, keys, groups, key_of, scales, fp32_rows)
        pypto.set_vec_tile_shapes(1, keys)
        return pypto.reshape(pypto.maximum(ids, 0), [keys]), sc
    # the same slots, with the row ids kept for the payload gather
    safe, slot = kv_decode.group_slots(pypto, ids, keys, groups, key_of, fp32_rows,
                                       min(n, 2 * kv_decode.TILE_ELEMS))
    return safe, pypto.index_select(scales, 0, slot)


def _scale_values(pypto, sc, e4m3):
    """FP32 each group's scale value of the scale bytes ``sc [n]`` (E8M0 power or, with
    ``e4m3``, E4M3 value), in the decode's subgraph: the decode gathers them from global
    memory, so nothing is reshaped on chip.  (A task of their own after the scale bytes
    before: FLASH TP4 T=192 246.9 -> 242.8 us for the compressed part's, 232.3 us with the
    window's too.)"""
    pypto.set_vec_tile_shapes(min(sc.shape[0], SCALE_TILE))
    return (mx_decode.e4m3_values(pypto, mx_decode.unsigned_codes(pypto, sc)) if e4m3
            else mx_decode.e8m0_pow2(pypto, sc))


def _lookup(pypto, table, idx, keys, d, sv, sidx):
    """BF16 ``[keys, d]``: the table entries at integer ``idx [keys, d]`` times each element's
    group scale, gathered from ``sv`` (global memory) at ``sidx`` (:func:`scale_index`)."""
    rt = _key_rows(keys, d)
    pypto.set_vec_tile_shapes(rt * d)
    val = pypto.index_select(table, 0, pypto.reshape(idx, [keys * d]))
    pypto.set_vec_tile_shapes(rt, d)
    val = pypto.mul(pypto.reshape(val, [keys, d]), pypto.index_select(sv, 0, sidx))
    return pypto.cast(val, pypto.DT_BF16)


def _window_keys(pypto, ids, payload, scales, table, sidx, keys, d, group, *,
                 fp32_rows=False):
    """BF16 ``[keys, d]``: the MXFP8 window rows named by INT32 ``ids [1, keys]`` (-1: row 0
    is read; the caller masks it), as :func:`v41.kv_decode.window_keys` computes them, but
    in ``[rows, d]`` tiles of whole keys: ``payload`` uint8 ``[cache rows, d]`` E4M3 codes,
    each element's E8M0 scale gathered from the part's scale values at ``sidx`` (no
    reshape between the tiles and the ``[keys, d]`` result)."""
    g = d // group
    safe, sc = _scale_bytes(pypto, ids, keys, g, scales, fp32_rows)
    with one_subgraph(pypto):
        sv = _scale_values(pypto, sc, False)
        pypto.set_vec_tile_shapes(_key_rows(keys, d), d)
        codes = pypto.cast(pypto.index_select(payload, 0, safe), pypto.DT_FP32)
        idx = pypto.cast(pypto.add(codes, 128.0), _index_dtype(pypto))
        return _lookup(pypto, table, idx, keys, d, sv, sidx)


def _fp4_keys(pypto, ids, payload, scales, sidx, keys, d, group, *, high_first=False,
              scale_e8m0=False, fp32_rows=False, wide=False):
    """BF16 ``[keys, d]``: the MXFP4 rows named by INT32 ``ids [1, keys]``, as
    :func:`v41.kv_decode.fp4_keys` computes them, in ``[rows, d]`` tiles of whole keys:
    ``payload`` uint8 ``[cache rows, d/2]`` packed E2M1 pairs; the table of
    :func:`v41.kv_decode.nibble_table` (``high_first``: the swapped one) and the byte column
    and INT16 table offset of :func:`v41.kv_decode.nibble_constants` for ``d`` columns are
    built in the decode's task (see the module docstring: built before the loops, their
    edges held back the decodes).  The table index ``byte + offset`` (below 768) is INT16
    arithmetic: no FP32 tile on the way, so with ``wide`` its tiles take twice the rows
    (the index goes through global memory for the gather, and the cost model charges each
    copy-out 300 cycles plus its bytes: a pair's decode 61.7 k -> 54.4 k cycles).  One
    token's tiles stay narrow (FLASH TP4 T=48 116.9 us; wide 120.3 us)."""
    g = d // group
    safe, sc = _scale_bytes(pypto, ids, keys, g, scales, fp32_rows)
    with one_subgraph(pypto):
        sv = _scale_values(pypto, sc, not scale_e8m0)
        table = kv_decode.nibble_table(pypto, high_first=high_first)
        byte_of, offset = kv_decode.nibble_constants(pypto, d)
        pypto.set_vec_tile_shapes(1, d)
        offset = pypto.cast(offset, _index_dtype(pypto))  # 128 / 512: exact
        pypto.set_vec_tile_shapes(min(keys, (1 + wide) * _key_rows(keys, d)), d)
        packed = pypto.index_select(payload, 0, safe)  # [keys, d/2]
        b = pypto.cast(pypto.index_select(packed, 1, byte_of), _index_dtype(pypto))  # [keys, d]
        idx = pypto.add(b, pypto.expand_clone(offset, [keys, d]))
        return _lookup(pypto, table, idx, keys, d, sv, sidx)


def _token(pypto, t, q, sink, win, comp, out, o, wide=False):
    """Token ``t``'s attention over its window keys then its compressed keys (``comp``
    None: window only) as one softmax, written to ``out[t]`` with one BF16 cast (``wide``:
    the wide index tiles of :func:`_fp4_keys`)."""
    h, d = o["h"], o["d"]
    qt = pypto.view(q, [h, d], [t * h, 0])  # q: a [tokens * h, d] GM view
    indices, payload, scales, rows_c, piece, keys = win
    parts = []
    for j in range(keys // piece):  # unrolled at trace time
        ids = pypto.view(indices, [1, piece], [t, j * piece])
        parts.append((_window_keys(pypto, ids, payload, scales, o["e4m3"], rows_c, piece, d,
                                   o["wgroup"], fp32_rows=o["fp32_rows"]), ids))
    if comp is not None:
        cindices, cpayload, cscales, crows_c, cpiece, ckeys = comp
        for c in range(ckeys // cpiece):  # unrolled at trace time
            ids = pypto.view(cindices, [1, cpiece], [t, c * cpiece])
            parts.append((_fp4_keys(
                pypto, ids, cpayload, cscales, crows_c, cpiece, d, o["cgroup"],
                high_first=o["high_first"], scale_e8m0=o["scale_e8m0"],
                fp32_rows=o["fp32_rows"], wide=wide), ids))
    prods, mx, l_run = _softmax_pv(pypto, qt, parts, sink, h, d, o)
    _output(pypto, t, prods, mx, l_run, sink, out, h, d, o)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``sparse_attention(q, window_kv, window_kv_scale, indices,
    compressed_kv, compressed_kv_scale, compressed_indices, attn_sink, out)`` for ``config``
    and ``case`` (heads, keys, ckeys, blocks and cblocks fixed; tokens dynamic)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"tokens": 1})
    h, d, half, g, cg = dm["heads"], dm["head_dim"], dm["half"], dm["groups"], dm["cgroups"]
    keys, ckeys, bs = dm["keys"], dm["ckeys"], dm["block_size"]
    rows, crows = dm["blocks"] * bs, dm["cblocks"] * bs
    wgroup, cgroup = config.cache.window_group, config.cache.compressed_group
    tile, ctile = key_tile(keys), key_tile(ckeys)
    scale = float(d) ** -1.0 if variant == "wrong_scale" else float(d) ** -0.5
    use_sink = variant != "no_sink"
    sink_num = variant == "sink_numerator"
    mask = variant != "unmasked"
    use_compressed = variant != "no_compressed" and not dm["window_only"]
    fp32_rows = variant == "fp32_row_index"
    scale_e8m0 = variant == "compressed_e8m0"
    high_first = variant == "nibble_swap"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options, pass_options=PASS_OPTIONS)
    def sparse_attention(
        q: pypto.Tensor([tokens_dim, h, d], pypto.DT_BF16),
        window_kv: pypto.Tensor([dm["blocks"], bs, 1, d], pypto.DT_UINT8),
        window_kv_scale: pypto.Tensor([dm["blocks"], bs, 1, g], pypto.DT_UINT8),
        indices: pypto.Tensor([tokens_dim, keys], pypto.DT_INT32),
        compressed_kv: pypto.Tensor([dm["cblocks"], bs, 1, half], pypto.DT_UINT8),
        compressed_kv_scale: pypto.Tensor([dm["cblocks"], bs, 1, cg], pypto.DT_UINT8),
        compressed_indices: pypto.Tensor([tokens_dim, ckeys], pypto.DT_INT32),
        attn_sink: pypto.Tensor([h], pypto.DT_FP32),
        out: pypto.Tensor([tokens_dim, h, d], pypto.DT_BF16),
    ):
        tokens = q.shape[0]
        # in-place GM views of the caches: payload one row per key, scales flat
        payload = pypto.reshape(window_kv, [rows, d], inplace=True)
        scales = pypto.reshape(window_kv_scale, [rows * g], inplace=True)
        cpayload = pypto.reshape(compressed_kv, [crows, half], inplace=True)
        cscales = pypto.reshape(compressed_kv_scale, [crows * cg], inplace=True)
        sink = pypto.reshape(attn_sink, [h, 1], inplace=True)
        q2 = pypto.reshape(q, [tokens * h, d], inplace=True)
        opts = dict(h=h, d=d, scale=scale, mask=mask, use_sink=use_sink,
                    sink_num=sink_num, fp32_rows=fp32_rows, wgroup=wgroup, cgroup=cgroup,
                    scale_e8m0=scale_e8m0, e4m3=mx_decode.e4m3_table(pypto),
                    high_first=high_first)
        rows_c = scale_index(pypto, tile, d, wgroup)
        crows_c = scale_index(pypto, ctile, d, cgroup)
        win = (indices, payload, scales, rows_c, tile, keys)
        comp = (compressed_indices, cpayload, cscales, crows_c, ctile, ckeys)
        comp = comp if use_compressed else None
        # k3 iterations of 3 tokens, k2 of 2, then one token an iteration: as few tokens an
        # iteration as keep the iterations within one wave of the vector cores (pairs past
        # one wave, triples past two; all triples from 3 waves)
        k3 = (tokens - 2 * WAVE).max(0).min(tokens // 3)
        rest = tokens - 3 * k3
        k2 = (rest - WAVE + k3).max(0).min(rest // 2)
        for g in pypto.loop(k3, name="SA_TRIPLES", idx_name="g"):
            for r in range(3):  # unrolled at trace time
                _token(pypto, g * 3 + r, q2, sink, win, comp, out, opts, wide=True)
        for g in pypto.loop(k2, name="SA_PAIRS", idx_name="g2"):
            for r in range(2):  # unrolled at trace time
                _token(pypto, 3 * k3 + g * 2 + r, q2, sink, win, comp, out, opts, wide=True)
        for t in pypto.loop(rest - 2 * k2, name="SA_TOKENS", idx_name="t"):
            _token(pypto, 3 * k3 + 2 * k2 + t, q2, sink, win, comp, out, opts)

    return sparse_attention
