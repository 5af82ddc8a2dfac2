"""In-kernel decode of packed MXFP4 expert weights (trace-time helpers; golden
``goldens.moe.dequantize_fp4_fast`` / ``goldens.quant.dequantize_fp4_expert_weight``).

A routed expert matrix is output-major ``[N, K]`` stored packed: uint8 ``[N, K/2]`` whose
byte ``i`` holds logical column ``2i`` in its LOW nibble and ``2i+1`` in its high nibble
(E2M1 codes, bit 3 = sign), and one uint8 E8M0 code per 32 logical columns ``[N, K/32]``
(so packed column ``i`` uses scale column ``i // 16``).  The weights of ``L`` local experts
are stacked ``[L, N, K/2]`` / ``[L, N, K/32]``.

Instead of interleaving the nibbles back into ``[N, K]`` (a 1-wide column scatter is not an
aligned tile), :func:`fp4_pair_tile` returns the two nibble planes separately: ``lo`` =
logical columns ``0, 2, 4, ...`` and ``hi`` = ``1, 3, 5, ...``, each ``[n_tile, kh]``; a
caller contracts ``x[:, even] @ lo^T + x[:, odd] @ hi^T``.  Values are exact in BF16: an
E2M1 value has at most two significant bits and ``2^(s-127)`` is a power of two (the
``exp`` estimate of the power is rounded away by the BF16 cast, as in
:mod:`v41.mx_decode`).

Schedule (A5 cost model): the decode of one weight tile is forced into one subgraph
(:mod:`v41.subgraph`): left to the partitioner it was cut into many small subgraphs whose
intermediates went through global memory.  A tile is whole rows, which are contiguous, so
the packed weight is read through a ``[rows * K/32, 16]`` reshape of the GM tensor: every
step runs in the same ``[t, 16]`` tiles (one scale group per tile row, ``t`` =
:func:`group_rows`, 1024 at FLASH) from the read to the BF16 result.  Each value is a
gather (:func:`decode_tables`): a byte's two E2M1 values from two 384-entry tables, and its
group's ``2^(s-127)`` from a 384-entry power-of-two table, gathered as a ``[t, 1]`` column
and expanded along the row.  The tile's scale codes are read and made gather indices in one
pass over its whole scale column (``[n/t, t]`` rows of a GM reshape), which the power
gathers then read as ``[t, 1]`` index columns.  Each plane gathers the power from its own
copy of the table: one shared power tile was spilled to global memory and read back between
the two planes.  Tables hold an entry at ``code + 128`` so a byte the interpreter reads as
signed (-128..127) and a card reads as unsigned (0..255) find the same value.

A gather reads its index from global memory, so each index tile is written there first;
copies cost a fixed latency on top of their bytes (``harness.cost_audit``).  One launch
decoding one FLASH tile is estimated at 127.6 k cycles for W1 ``[256, 5120]`` and 116.1 k
for W2 ``[512, 2304]``.  It was 170.8 k / 156.4 k when each scale code was repeated along
its row by a column gather and each group's power gathered element by element: one more
64 KB index tile written per 1,024 groups.  Before that, when the power was built by six
vector steps on a ``[1024, 1]`` scale tile and broadcast to the two planes through global
memory, a W2 tile cost 216.9 k in an earlier probe (154.7 k there with the column gather).
The cost model charges a gather by its smallest operand (a few cycles for 16,384 elements,
:mod:`harness.cost_audit`): these figures lean on that charge, and recharged by their
largest operand the vector pipe of a W1 tile goes from 100.6 k to 176.0 k cycles (from
115.2 k to 221.9 k before).  pypto 0.2.0's TuneSyncForVF pass fails on these gathers in
most tilings (``Cannot find GATHER in PIPE_MTE2``); the A5 cost-model configuration turns
vector fusion off (``harness/platforms/data``), which that pass needs.
"""

from v41.mx_decode import e2m1_values, e8m0_pow2, table_bytes
from v41.subgraph import one_subgraph

PACKED_PER_SCALE = 16  # packed bytes (32 logical columns) per E8M0 scale
VEC_COLS = 1024  # vector tile columns at most (A5 unified buffer)
TABLE_SPAN = 384  # byte table entries: a code read as signed or unsigned, plus 128
GROUP_ROWS = 1024  # [GROUP_ROWS, 16] FP32 tiles (64 KB): 2048 overflows the UB, 512 is slower


def even_odd_ids(pypto, k):
    """``(even, odd)`` INT32 ``[k/2]``: logical column ids ``2i`` and ``2i+1`` (index
    vectors for an ``index_select`` of an activation's columns)."""
    half = k // 2
    pypto.set_vec_tile_shapes(min(half, VEC_COLS))
    even = pypto.cast(pypto.mul(pypto.arange(0.0, float(half), 1.0), 2.0), pypto.DT_INT32)
    return even, pypto.add(even, 1)


def decode_tables(pypto, *, swap_nibbles=False):
    """The tables :func:`fp4_pair_tile` gathers from (build once, before the loops):
    ``(lo, hi, pow2_lo, pow2_hi)``, FP32 ``[384]``.  ``lo`` / ``hi``: entry ``k`` is the E2M1
    value of the low / high nibble of byte ``(k - 128) mod 256``; ``pow2_*``: entry ``k`` is
    ``2^(((k - 128) mod 256) - 127)``, one copy per plane.  ``swap_nibbles`` swaps ``lo`` and
    ``hi`` (a deliberately wrong reading: logical column ``2i`` from the HIGH nibble, for the
    harness's wrong-kernel tests)."""
    pypto.set_vec_tile_shapes(TABLE_SPAN)
    b = table_bytes(pypto, TABLE_SPAN)
    high = pypto.floor(pypto.mul(b, 1.0 / 16.0))
    low = pypto.sub(b, pypto.mul(high, 16.0))
    lo, hi = e2m1_values(pypto, low), e2m1_values(pypto, high)
    pow2 = e8m0_pow2(pypto, b)
    pow2_hi = pypto.add(pow2, 0.0)  # a second tensor: the two planes' gathers stay apart
    if swap_nibbles:
        lo, hi = hi, lo
    return lo, hi, pow2, pow2_hi


def group_rows(n: int) -> int:
    """Scale groups per tile: the largest divisor of ``n`` (a weight tile's groups) that is at
    most :data:`GROUP_ROWS`, so the tile's scale column is whole ``[n / t, t]`` rows."""
    return max(d for d in range(1, min(n, GROUP_ROWS) + 1) if n % d == 0)


def fp4_pair_tile(pypto, packed, scales, tables, expert, n0, n_tile):
    """``(lo, hi)`` BF16 ``[n_tile, K/2]``: whole rows ``n0 .. n0+n_tile`` of local expert
    ``expert`` of the stacked packed weight ``packed [L, N, K/2]`` (scales ``[L, N, K/32]``),
    decoded exactly; ``lo`` holds logical columns ``2i``, ``hi`` ``2i+1``.  ``tables`` from
    :func:`decode_tables`; ``n0`` a multiple of ``n_tile``, which divides ``N``.

    Rounding boundary: none until the BF16 cast of ``value * 2^(s-127)``, which is exact
    (golden ``goldens.quant.dequantize_fp4_expert_weight``)."""
    rows_n = packed.shape[1]
    if rows_n % n_tile:
        raise ValueError(f"n_tile: {n_tile} does not divide the weight's {rows_n} rows")
    with one_subgraph(pypto):
        return _pair_tile(pypto, packed, scales, tables, expert, n0, n_tile)


def _pair_tile(pypto, packed, scales, tables, expert, n0, n_tile):
    lo_t, hi_t, pow2_lo, pow2_hi = tables
    experts, rows_n, kh = packed.shape
    groups = kh // PACKED_PER_SCALE  # one E8M0 scale per 16 packed bytes
    n = n_tile * groups
    t = group_rows(n)
    # whole rows are contiguous: the tile is rows of 16 packed bytes and their one scale
    # (GM reshapes, no copy), so no step changes the tile layout until the result; row0 is a
    # multiple of n, hence of t
    row0 = (expert * rows_n + n0) * groups
    pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
    codes = pypto.view(pypto.reshape(packed, [experts * rows_n * groups, PACKED_PER_SCALE]),
                       [n, PACKED_PER_SCALE], [row0, 0])
    idx = pypto.cast(pypto.add(pypto.cast(codes, pypto.DT_FP32), 128.0), pypto.DT_INT32)
    # the tile's scale column read and made gather indices whole ([n/t, t] rows), then taken
    # as the [n, 1] index of each group's power
    pypto.set_vec_tile_shapes(min(n // t, 8), t)
    sc = pypto.view(pypto.reshape(scales, [experts * rows_n * groups // t, t]), [n // t, t],
                    [row0 // t, 0])
    sidx = pypto.cast(pypto.add(pypto.cast(sc, pypto.DT_FP32), 128.0), pypto.DT_INT32)
    pypto.set_vec_tile_shapes(t, 1)
    sidx = pypto.reshape(sidx, [n, 1])
    out = []
    for table, pow2 in ((lo_t, pow2_lo), (hi_t, pow2_hi)):  # unrolled at trace time
        pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
        val = pypto.index_select(table, 0, idx)
        pypto.set_vec_tile_shapes(t, 1)
        pw = pypto.index_select(pow2, 0, sidx)
        pypto.set_vec_tile_shapes(t, PACKED_PER_SCALE)
        val = pypto.mul(val, pypto.expand_clone(pw, [n, PACKED_PER_SCALE]))
        val = pypto.cast(val, pypto.DT_BF16)
        pypto.set_vec_tile_shapes(min(n_tile, 16), min(kh, VEC_COLS))
        out.append(pypto.reshape(val, [n_tile, kh]))
    return out[0], out[1]
