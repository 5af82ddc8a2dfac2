"""MoE router gate kernel (golden: ``goldens.router.route``).

``logits = x_norm @ gate_w^T / gate_temperature`` [FP32 accumulation, cube matmul],
``s = sqrt(softplus(logits))`` with ``softplus(x) = max(x, 0) + log1p(exp(-|x|))`` [FP32];
the top ``k = num_experts_per_tok`` experts of ``s + correction_bias`` are selected and the
weights gather the UNBIASED ``s``: ``w = s_sel / (sum s_sel + 1e-20) * routed_scaling_factor``
(the division only when ``norm_topk_prob`` and ``k > 1``).

Tie rule (the golden's stable order): biased score descending, equal scores by ascending
expert index.  The kernel selects by ``k`` arg-max passes: ``m = max(b)``; the chosen
expert is the SMALLEST index ``e`` with ``b[e] == m`` (``amin`` over an FP32 iota masked
by an exact FP32 equality); its ``s`` is gathered by a one-hot sum; it is then masked to
``-1e38`` for the next pass.  Column ``j`` is the ``j``-th best expert in that order.
(``pypto.topk`` documents no tie order, so it is not used for selection.)

Inactive rows (contract, reference-facts 4.14): rows ``t >= num_tokens`` get index 0 and
weight 0.  The routing loop covers only the row tiles below ``num_tokens`` (the last
tile's ``valid_shape`` stops at row ``num_tokens - 1``, so padding ``x_norm`` rows are never
read); a second loop writes zeros to rows ``num_tokens .. tokens - 1``.  ``num_tokens`` is a
runtime INT32 ``[1]`` tensor read with ``num_tokens[0]``; the caller validates it to
``[0, tokens]`` before launch (``harness.entries.gate.validate_launch``).

ABI
---
================  ================  ========  =====
name              shape             dtype     role
================  ================  ========  =====
x_norm            (tokens, hidden)  bfloat16  in
gate_weight       (experts, hidden) float32   in
correction_bias   (experts,)        float32   in
num_tokens        (1,)              int32     in
indices           (tokens, k)       int32     out
weights           (tokens, k)       float32   out
================  ================  ========  =====

``tokens`` from ``case["tokens"]`` (>= 1) is a dynamic axis; ``num_tokens`` (active rows)
is a runtime value in ``[0, tokens]``.
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.cube_tiles import row_tile

# Schedule (FLASH T=192, 384 experts x 5,120 FP32 weight): every cube task reads its
# [rows, 5120] FP32 x tile and its [N, 5120] weight slice, so the row tile sets how often
# the weight is re-read and the expert tile how often x is; 64 rows with N 48 (3 x 8 = 24 cube
# tasks on the 28 cube cores) was the best (rows 32 / N 64: 72.4 us, 64 / 64: 45.8,
# 64 / 48: 44.1; 96 / 32: 65.3).  The routing after the product runs on 16-row vector tiles:
# each is one task from the logits to the index / weight writes (32-row tiles spilled and were
# cut into a 5.7 k + 16.4 k-cycle pair of dependent tasks).  An L0 K step of 256 instead of
# 128 and the iota / bias rows built in each row iteration (built once before the loop, their
# two tasks had an edge to every routing task: 4.7 k-cycle serial resolves each, ahead of the
# casts) took FLASH T = 4 / 48 / 192 / 384 from 31.9 / 39.7 / 44.1 / 74.2 to 32.0 / 39.6 /
# 42.2 / 72.6 us (same bits; ROUTE_ROWS 8: 43.5 at T=192).
ROW_TILE = 64  # most token rows per loop iteration (one cube M tile)
ROUTE_ROWS = 16  # rows of a routing vector tile (one task each)
CUBE_CORES = 28  # A5
TOPK_NORM_EPS = 1e-20
MASKED = -1.0e38  # below any biased score

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "unbiased_select": "selects by the unbiased s (ignores correction_bias)",
    "biased_weights": "takes the weights from the biased score s + bias",
    "higher_index_ties": "breaks ties toward the HIGHER expert index",
    "route_padding": "routes every row, also rows at or past num_tokens (padding rows get "
                     "real experts and weights instead of index 0 / weight 0)",
    "skip_padding": "leaves rows at or past num_tokens unwritten",
}

ABI = (
    Arg("x_norm", ("tokens", "hidden"), "bfloat16", "in"),
    Arg("gate_weight", ("experts", "hidden"), "float32", "in"),
    Arg("correction_bias", ("experts",), "float32", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("indices", ("tokens", "k"), "int32", "out"),
    Arg("weights", ("tokens", "k"), "float32", "out"),
)


def expert_tile(row_tiles: int, experts: int) -> int:
    """Cube N tile for ``row_tiles`` row tiles: the smallest of 32 / 48 / 64 whose cube tasks
    (row tiles x experts / N) still fit the cube cores (FLASH T=7, one row tile: N 32 31.9 us,
    N 64 35.4; T=192, three: N 48 44.1, N 64 45.8)."""
    for n in (32, 48):
        if row_tiles * -(-experts // n) <= CUBE_CORES:
            return n
    return 64


def dims(config, case: dict) -> dict[str, int]:
    m = config.moe
    if m.scoring_func != "sqrtsoftplus":
        raise ValueError(f"config.moe.scoring_func: {m.scoring_func!r} is not 'sqrtsoftplus'")
    return {"tokens": case_int(case, "tokens", minimum=1), "hidden": config.hidden_size,
            "experts": m.n_routed_experts, "k": m.num_experts_per_tok}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None, rows_per_tile: int | None = None):
    """The jit kernel ``gate(x_norm, gate_weight, correction_bias, num_tokens, indices,
    weights)``: rows below ``num_tokens`` routed, the rest index 0 / weight 0."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    m = config.moe
    hidden, experts, k = config.hidden_size, m.n_routed_experts, m.num_experts_per_tok
    inv_temp = 1.0 / m.gate_temperature
    use_temp = m.gate_temperature != 1.0
    normalize = bool(m.norm_topk_prob and k > 1)
    scale = float(m.routed_scaling_factor)
    tokens_hint = case_int(case, "tokens", default=ROW_TILE, minimum=1)
    rows = row_tile(tokens_hint, ROW_TILE, rows_per_tile)
    n_tile = expert_tile(-(-tokens_hint // rows), experts)
    route_rows = min(rows, ROUTE_ROWS)
    k_tile = (k + 7) // 8 * 8
    use_bias = variant != "unbiased_select"
    biased_weights = variant == "biased_weights"
    high_ties = variant == "higher_index_ties"
    route_padding = variant == "route_padding"
    zero_padding = variant not in ("route_padding", "skip_padding")
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def gate(
        x_norm: pypto.Tensor([tokens_dim, hidden], pypto.DT_BF16),
        gate_weight: pypto.Tensor([experts, hidden], pypto.DT_FP32),
        correction_bias: pypto.Tensor([experts], pypto.DT_FP32),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        indices: pypto.Tensor([tokens_dim, k], pypto.DT_INT32),
        weights: pypto.Tensor([tokens_dim, k], pypto.DT_FP32),
    ):
        tokens = x_norm.shape[0]
        if route_padding:
            active = tokens
        else:
            active = num_tokens[0]
        # FP32 operands: L0A / L0B hold m0 / n0 x k0 x 4 bytes <= 64 KiB; K 256 a step, 1024
        # an L1 load (L1: (64 + 64) x 1024 x 4 bytes = 512 KiB at most), N from expert_tile
        pypto.set_cube_tile_shapes([rows, rows], [256, 1024], [n_tile, n_tile])
        for i in pypto.loop((active + rows - 1) // rows, name="GATE_ROWS", idx_name="r"):
            start = i * rows
            valid = (active - start).min(rows)
            pypto.set_vec_tile_shapes(rows, min(hidden, 512))
            x32 = pypto.cast(pypto.view(x_norm, [rows, hidden], [start, 0],
                                        valid_shape=[valid, hidden]), pypto.DT_FP32)
            logits = pypto.matmul(x32, gate_weight, pypto.DT_FP32, b_trans=True)  # [rows, E]
            pypto.set_vec_tile_shapes(experts)  # 1-D: one tile (a 2-D shape tiles by 1 element)
            iota = pypto.arange(0.0, float(experts), 1.0)
            pypto.set_vec_tile_shapes(1, experts)
            bias = pypto.reshape(correction_bias, [1, experts])
            iota = pypto.reshape(iota, [1, experts])
            pypto.set_vec_tile_shapes(route_rows, experts)
            if use_temp:
                logits = pypto.mul(logits, inv_temp)
            soft = pypto.add(pypto.maximum(logits, 0.0),
                             pypto.log1p(pypto.exp(pypto.mul(pypto.abs(logits), -1.0))))
            s = pypto.sqrt(soft)
            if use_bias:
                b = pypto.add(s, pypto.expand_clone(bias, [rows, experts],
                                                    valid_shape=[valid, experts]))
            else:
                b = s
            iota_t = pypto.expand_clone(iota, [rows, experts], valid_shape=[valid, experts])
            ids = []
            ws = []
            for _ in range(k):  # unrolled at trace time
                best = pypto.expand_clone(pypto.amax(b, -1, keepdim=True), [rows, experts],
                                         valid_shape=[valid, experts])
                if high_ties:
                    pick = pypto.amax(pypto.where(pypto.eq(b, best), iota_t, -1.0), -1,
                                      keepdim=True)
                else:
                    pick = pypto.amin(pypto.where(pypto.eq(b, best), iota_t, float(experts)), -1,
                                      keepdim=True)
                hit = pypto.eq(iota_t, pypto.expand_clone(pick, [rows, experts],
                                                          valid_shape=[valid, experts]))
                src = b if biased_weights else s
                ws.append(pypto.sum(pypto.where(hit, src, 0.0), -1, keepdim=True))
                ids.append(pick)
                b = pypto.where(hit, MASKED, b)
            # normalization on [rows, 1] columns (a reduction over k < 8 FP32 lanes is
            # rejected: the last tile axis must be 32-byte aligned)
            if normalize:
                total = ws[0]
                for j in range(1, k):
                    total = pypto.add(total, ws[j])
                denom = pypto.add(total, TOPK_NORM_EPS)
            # each column straight to its output column (a concat of the k columns went
            # through GM and a join task: FLASH T=192 48.6 -> 45.8 us without it)
            for j in range(k):
                wj = ws[j]
                if normalize:
                    wj = pypto.div(wj, denom)
                pypto.assemble(pypto.cast(ids[j], pypto.DT_INT32), [start, j], indices)
                pypto.assemble(pypto.mul(wj, scale), [start, j], weights)
        if zero_padding:  # rows active .. tokens - 1: index 0, weight 0
            pypto.set_vec_tile_shapes(rows, k_tile)
            for p in pypto.loop((tokens - active + rows - 1) // rows, name="GATE_PADDING",
                                idx_name="p"):
                start = active + p * rows
                valid = (tokens - start).min(rows)
                pypto.assemble(pypto.full([rows, k], 0, pypto.DT_INT32, valid_shape=[valid, k]),
                               [start, 0], indices)
                pypto.assemble(pypto.full([rows, k], 0.0, pypto.DT_FP32, valid_shape=[valid, k]),
                               [start, 0], weights)

    return gate
