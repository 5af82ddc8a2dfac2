"""Routed experts of one EP rank: its ``L`` local MXFP4 experts over the rows dispatched to
it (golden: ``goldens.moe.routed_expert``, one call per local expert on that expert's rows).

The host dispatch (metadata) sorts the rank's (token, slot) pairs by local expert: rows
``expert_offsets[j] .. expert_offsets[j+1]`` of ``x`` belong to local expert ``j``, rows at
or past ``expert_offsets[L]`` are padding.  Per local expert ``j`` and row tile of
``ROW_TILE`` of its rows (offsets are read from the INT32 tensor at run time: the loop bound
and the view offsets are data-dependent, like ``v41.compressor_ratio2``'s request ranges)::

    a  = MX(x)                              MXFP8 activation, exact BF16 (v41.mx_linear)
    g  = [BF16](a @ W1^T)   u = [BF16](a @ W3^T)         BF16 x BF16 cube, FP32 accumulation
    h  = [BF16](silu(min(g, lim)) * clip(u, -lim, lim) * route_weight)   FP32; weight BEFORE W2
    y  = [BF16](MX(h) @ W2^T)

Each weight is decoded ONE TILE AT A TIME from its packed form (:mod:`v41.mx_fp4_decode`):
``I_TILE`` rows of W1/W3 (all of K) or ``D_TILE`` rows of W2 (all of K: one decode and
two products per W2 tile, so the traced body does not grow with ``inter``).  The nibble
planes are contracted against the even and odd activation columns,
``a[:, 0::2] @ lo^T + a[:, 1::2] @ hi^T``, so no interleaved weight is ever formed.  Every
product is exact (both operands are exact MX values); only the FP32 summation order
differs from the golden's FP64 accumulation with one rounding, far inside the contract's
per-row bound.  An expert without rows runs zero row tiles, so its weights are never read;
an expert's weights are decoded once per row tile of its rows (once per expert at decode
sizes: 192 tokens x 6 / 384 experts is about 3 rows per expert).  The ``I_TILE`` blocks of
``h`` are whole MX groups, so ``MX(h)`` is quantized block by block (unrolled at trace
time) into the scratch output ``h_mx`` (row ``r``: the even columns of
``MX(h)``, then the odd ones; rows of no expert are left unwritten), which the row tile's W2
blocks read back as two ``[rows, inter/2]`` operands (an in-kernel ``pypto.tensor`` written
by one loop and read by a sibling loop crashed the simulator with an invalid slot index).
Rows at or past ``expert_offsets[L]`` are written with exact zeros.

Per expert and row tile (one loop over experts, a nested loop over their row tiles):
``MX(x)`` of the tile's rows, its even columns then its odd ones, into the scratch output
``x_mx`` (each dispatched row belongs to one expert, so it is quantized exactly once), then
W1/W3 and the SwiGLU into ``h_mx``, then W2 into ``y``.  ``x_mx`` is written and read in
the same row tile: pypto 0.2.0 tracks a tensor written across loop iterations in cells of
its static dims only, so with ``MX(x)`` in a loop of its own over all rows (phase 1 below)
the products got dependency edges from that loop's LAST iteration only and raced the
others (``harness.order_audit``); in the row tile its edges are exact.

The sums are the same in any phase order.  Schedule (A5 cost model): the runtime hands a
core the ready tasks in order, so a small vector task queued behind the weight decodes
held every cube product that needs it.  With ``MX(x)`` computed per expert inside phase 2,
the cube sat idle through each submission's decode wave.  Moving it to phase 1 (a loop of
its own before the experts) took a
FLASH EP8 rank (46 experts, 166 rows) from 4,967 to 3,901 us, splitting off phase 3 to
3,774 us, and forcing each row tile's ``MX(x)`` into one task (its chain of small tasks
queued behind the decodes too) to 3,709 us; reading each weight tile's scale column whole
(:mod:`v41.mx_fp4_decode`) took it to 3,225 us.  The ``I_TILE`` blocks of phase 2 and the
``D_TILE`` blocks of phase 3 are unrolled at trace time, so a row tile of an expert is one
function: with a loop per block a 48-expert launch was 1 + 162 + 180 functions, stitched
128 at a time into three submissions that the runtime ran one after another (each a vector
decode wave, then a cube wave); now it is one submission, whose W2 decodes overlap the
W1/W3 products (FLASH EP4 T=24 case 3,333.9 -> 2,649.9 us; rank 0's first 48-expert
launch 3.10 M -> 2.56 M cycles).  With W2 still a loop of its own after the unrolling, the
runtime ran every W2 decode first (they need nothing) while the cube idled, and every W2
product last, a cube-only tail with the vector cores idle: a 48-expert launch with one row
per expert (``moe``'s FLASH rank 0, whose balanced routing gives each of 84 experts one row)
took 3,400 us with a loop per block and 3,638-3,698 us unrolled.  W2 in the same row tile
as W1/W3 (one loop over experts) overlaps each expert's W2 products with later experts'
decodes: that launch 3,029 us, the EP4 T=24 case's rank 0 first launch 1,197 us.  Moving
``MX(x)`` back into the row tile as one forced task (the ordering fix above) costs little
now: the EP4 T=24 case 2,185.8 -> 2,220.7 us.

Applying the route weight after W2 instead is the same product up to rounding (``MX(h*w)``
vs ``MX(h)*w``): measured at TINY it stays inside the per-row bound, so the comparison
cannot tell the two placements apart and it is not offered as a wrong variant.

Host obligations (``harness.entries.routed_experts.validate_launch``, before launch):
``expert_offsets`` nondecreasing, ``offsets[0] = 0``, ``offsets[L] <= rows``; finite
``route_weight`` and ``x``; no E8M0 NaN code (255) in a scale.

ABI
---
==============  =====================  ========  =====
name            shape                  dtype     role
==============  =====================  ========  =====
x               (rows, hidden)         bfloat16  in
route_weight    (rows, 1)              float32   in
expert_offsets  (L + 1,)               int32     in
w1              (L, inter, hidden/2)   uint8     in
w1_scale        (L, inter, hidden/32)  uint8     in
w3              (L, inter, hidden/2)   uint8     in
w3_scale        (L, inter, hidden/32)  uint8     in
w2              (L, hidden, inter/2)   uint8     in
w2_scale        (L, hidden, inter/32)  uint8     in
y               (rows, hidden)         bfloat16  out
h_mx            (rows, inter)          bfloat16  out  (scratch: MX(h), even then odd)
x_mx            (rows, hidden)         bfloat16  out  (scratch: MX(x), even then odd)
==============  =====================  ========  =====

``rows`` (``case["rows"]`` >= 1) is a dynamic axis; ``L = n_routed_experts / case["ep"]``
(``ep`` absent or None: one rank owns every expert), or ``case["local"]`` when given.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41 import mx_fp4_decode, mx_linear
from v41.abi import Arg, case_int, jit_options, resolve
from v41.subgraph import one_subgraph

ROW_TILE = 16  # dispatched rows per row tile
# W1/W3 rows (and W2 column block) and W2 rows per decoded weight tile.  Larger tiles are
# fewer loop iterations per expert, so more experts fit one stitched submission (at most
# 128 functions, v41.abi) and their decodes overlap.  FLASH, 4 experts x 3 rows: 777 us at
# 128/128 with N 128 cube tiles, 621 us at 384/512, 499 us at 256/512 with N 256 tiles
# (768/512, 384/1024 and N 512 tiles are slower); 12 experts: 1,492 us.
I_TILE = 256
D_TILE = 512

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "no_route_weight": "never applies the route weight",
    "swap_nibbles": "reads logical column 2i from the HIGH nibble",
    "no_clamp": "skips the SwiGLU clamps",
    "skip_padding": "leaves rows at or past expert_offsets[L] unwritten",
}

ABI = (
    Arg("x", ("rows", "hidden"), "bfloat16", "in"),
    Arg("route_weight", ("rows", 1), "float32", "in"),
    Arg("expert_offsets", ("offsets",), "int32", "in"),
    Arg("w1", ("local", "inter", "hidden_half"), "uint8", "in"),
    Arg("w1_scale", ("local", "inter", "hidden_groups"), "uint8", "in"),
    Arg("w3", ("local", "inter", "hidden_half"), "uint8", "in"),
    Arg("w3_scale", ("local", "inter", "hidden_groups"), "uint8", "in"),
    Arg("w2", ("local", "hidden", "inter_half"), "uint8", "in"),
    Arg("w2_scale", ("local", "hidden", "inter_groups"), "uint8", "in"),
    Arg("y", ("rows", "hidden"), "bfloat16", "out"),
    Arg("h_mx", ("rows", "inter"), "bfloat16", "out"),
    Arg("x_mx", ("rows", "hidden"), "bfloat16", "out"),
)


def local_count(config, case: dict) -> int:
    """``L``: experts per rank for ``case["ep"]`` (None or absent: all experts), or
    ``case["local"]`` when given: a launch over that many of a rank's experts (the
    estimate-only SUT launches one expert at a time)."""
    n = config.moe.n_routed_experts
    if case and case.get("local") is not None:
        return case_int(case, "local", minimum=1)
    ep = case.get("ep") if case else None
    ep = 1 if ep is None else case_int(case, "ep", minimum=1)
    if n % ep:
        raise ValueError(f"case['ep']: {ep} does not divide n_routed_experts {n}")
    return n // ep


def dims(config, case: dict, i_tile: int = I_TILE) -> dict[str, int]:
    d, i = config.hidden_size, config.moe.intermediate_size
    for name, v, t in (("hidden_size", d, D_TILE), ("moe.intermediate_size", i, i_tile)):
        width = min(v, t)
        if v % width or width % 32:
            raise ValueError(f"config.{name}: {v} must be a multiple of {width} (itself a "
                             f"multiple of 32)")
    n_local = local_count(config, case)
    return {"rows": case_int(case, "rows", minimum=1), "hidden": d, "inter": i,
            "local": n_local, "offsets": n_local + 1, "hidden_half": d // 2,
            "hidden_groups": d // 32, "inter_half": i // 2, "inter_groups": i // 32}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _activation_rows(pypto, x, x_mx, start, valid, rows, even_odd):
    """Rows ``start .. start+valid`` of ``x_mx``: ``MX(x)`` of those rows of ``x``, its even
    columns then its odd ones, as one forced task (:mod:`v41.subgraph`): a chain of small
    tasks here was queued behind the weight decodes and held the cube products."""
    d = x.shape[1]
    dh = d // 2
    cols = mx_linear.cols
    with one_subgraph(pypto):
        pypto.set_vec_tile_shapes(rows, cols(d))
        x32 = pypto.cast(pypto.view(x, [rows, d], [start, 0], valid_shape=[valid, d]),
                         pypto.DT_FP32)
        a = mx_linear.mx_activation_bf16(pypto, x32, rows, valid, d)
        pypto.set_vec_tile_shapes(rows, cols(d))
        for half, ids in enumerate(even_odd):  # unrolled at trace time
            part = pypto.view(pypto.index_select(a, 1, ids), [rows, dh], [0, 0],
                              valid_shape=[valid, dh])
            pypto.assemble(part, [start, half * dh], x_mx)


def build(config, case: dict | None = None, *, variant: str = "reference",
          i_tile: int = I_TILE, runtime_options: dict | None = None):
    """The jit kernel ``routed_experts(x, route_weight, expert_offsets, w1, w1_scale, w3,
    w3_scale, w2, w2_scale, y, h_mx)``: every dispatched row's expert output, padding rows
    zero.  ``i_tile`` (a multiple of 32) sets the ``I_TILE`` width: tests use a smaller one
    so TINY runs several intermediate blocks."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    dm = dims(config, case or {"rows": 1}, i_tile)
    d, inter, n_local = dm["hidden"], dm["inter"], dm["local"]
    dh, ih = d // 2, inter // 2
    it, dt = min(inter, i_tile), min(d, D_TILE)
    limit = float(config.moe.swiglu_limit)
    rows = ROW_TILE
    clamp = variant != "no_clamp"
    use_weight = variant != "no_route_weight"
    swap = variant == "swap_nibbles"
    zero_padding = variant != "skip_padding"
    cols = mx_linear.cols
    options = jit_options(runtime_options)
    rows_dim = pypto.frontend.dynamic("rows")

    @pypto.frontend.jit(runtime_options=options)
    def routed_experts(
        x: pypto.Tensor([rows_dim, d], pypto.DT_BF16),
        route_weight: pypto.Tensor([rows_dim, 1], pypto.DT_FP32),
        expert_offsets: pypto.Tensor([n_local + 1], pypto.DT_INT32),
        w1: pypto.Tensor([n_local, inter, dh], pypto.DT_UINT8),
        w1_scale: pypto.Tensor([n_local, inter, d // 32], pypto.DT_UINT8),
        w3: pypto.Tensor([n_local, inter, dh], pypto.DT_UINT8),
        w3_scale: pypto.Tensor([n_local, inter, d // 32], pypto.DT_UINT8),
        w2: pypto.Tensor([n_local, d, ih], pypto.DT_UINT8),
        w2_scale: pypto.Tensor([n_local, d, inter // 32], pypto.DT_UINT8),
        y: pypto.Tensor([rows_dim, d], pypto.DT_BF16),
        h_mx: pypto.Tensor([rows_dim, inter], pypto.DT_BF16),
        x_mx: pypto.Tensor([rows_dim, d], pypto.DT_BF16),
    ):
        total = x.shape[0]
        # K 64/512: a third of the cube time of K 32/256 at FLASH (fewer, larger copies of the
        # decoded BF16 tiles into L1); N 256 halves the cube tasks of N 128 (N only splits
        # outputs: the K order, hence every FP32 sum, is the same)
        pypto.set_cube_tile_shapes([16, 16], [64, 512], [256, 256])
        tables = mx_fp4_decode.decode_tables(pypto, swap_nibbles=swap)
        x_even, x_odd = mx_fp4_decode.even_odd_ids(pypto, d)
        h_even, h_odd = mx_fp4_decode.even_odd_ids(pypto, it)
        for j in pypto.loop(n_local, name="RE_EXPERTS", idx_name="j"):
            s = expert_offsets[j]
            e = expert_offsets[j + 1]
            for i in pypto.loop((e - s + rows - 1) // rows, name="RE_ROWS", idx_name="i"):
                start = s + i * rows
                valid = (e - start).min(rows)
                _activation_rows(pypto, x, x_mx, start, valid, rows, (x_even, x_odd))
                for p in range(inter // it):  # unrolled at trace time (one function per row tile)
                    gu = []
                    for w, ws in ((w1, w1_scale), (w3, w3_scale)):
                        lo, hi = mx_fp4_decode.fp4_pair_tile(pypto, w, ws, tables, j, p * it,
                                                             it)
                        # re-view: a tensor entering a nested loop loses its valid shape
                        pypto.set_vec_tile_shapes(rows, cols(dh))
                        ae = pypto.view(x_mx, [rows, dh], [start, 0], valid_shape=[valid, dh])
                        ao = pypto.view(x_mx, [rows, dh], [start, dh], valid_shape=[valid, dh])
                        acc = pypto.add(pypto.matmul(ae, lo, pypto.DT_FP32, b_trans=True),
                                        pypto.matmul(ao, hi, pypto.DT_FP32, b_trans=True))
                        pypto.set_vec_tile_shapes(rows, it)
                        gu.append(pypto.cast(pypto.cast(acc, pypto.DT_BF16), pypto.DT_FP32))
                    g, u = gu
                    pypto.set_vec_tile_shapes(rows, it)
                    if clamp:
                        g = pypto.minimum(g, limit)
                        u = pypto.maximum(pypto.minimum(u, limit), -limit)
                    silu = pypto.div(g, pypto.add(pypto.exp(pypto.mul(g, -1.0)), 1.0))
                    h = pypto.mul(silu, u)
                    if use_weight:
                        pypto.set_vec_tile_shapes(rows, 8)
                        rw = pypto.view(route_weight, [rows, 1], [start, 0],
                                        valid_shape=[valid, 1])
                        pypto.set_vec_tile_shapes(rows, it)
                        h = pypto.mul(h, pypto.expand_clone(rw, [rows, it],
                                                            valid_shape=[valid, it]))
                    h32 = pypto.cast(pypto.cast(h, pypto.DT_BF16), pypto.DT_FP32)
                    hq = mx_linear.mx_activation_bf16(pypto, h32, rows, valid, it)
                    pypto.set_vec_tile_shapes(rows, it // 2)
                    he = pypto.view(pypto.index_select(hq, 1, h_even), [rows, it // 2], [0, 0],
                                    valid_shape=[valid, it // 2])
                    ho = pypto.view(pypto.index_select(hq, 1, h_odd), [rows, it // 2], [0, 0],
                                    valid_shape=[valid, it // 2])
                    pypto.assemble(he, [start, p * (it // 2)], h_mx)
                    pypto.assemble(ho, [start, ih + p * (it // 2)], h_mx)
                for nt in range(d // dt):  # unrolled at trace time
                    # all of K at once: h_mx holds MX(h)'s even columns, then its odd ones
                    lo, hi = mx_fp4_decode.fp4_pair_tile(pypto, w2, w2_scale, tables, j,
                                                         nt * dt, dt)
                    pypto.set_vec_tile_shapes(rows, cols(ih))
                    he = pypto.view(h_mx, [rows, ih], [start, 0], valid_shape=[valid, ih])
                    ho = pypto.view(h_mx, [rows, ih], [start, ih], valid_shape=[valid, ih])
                    mm_even = pypto.matmul(he, lo, pypto.DT_FP32, b_trans=True)
                    mm_odd = pypto.matmul(ho, hi, pypto.DT_FP32, b_trans=True)
                    pypto.set_vec_tile_shapes(rows, dt)
                    acc = pypto.add(mm_even, mm_odd)
                    out = pypto.view(pypto.cast(acc, pypto.DT_BF16), [rows, dt], [0, 0],
                                     valid_shape=[valid, dt])
                    pypto.assemble(out, [start, nt * dt], y)
        if zero_padding:  # rows expert_offsets[L] .. rows - 1
            used = expert_offsets[n_local]
            pypto.set_vec_tile_shapes(rows, cols(d))
            for p in pypto.loop((total - used + rows - 1) // rows, name="RE_PADDING",
                                idx_name="p"):
                start = used + p * rows
                valid = (total - start).min(rows)
                pypto.assemble(pypto.full([rows, d], 0.0, pypto.DT_BF16, valid_shape=[valid, d]),
                               [start, 0], y)

    return routed_experts
