"""RoPE row materialization: ``rope_cos/sin[t] = freqs_cos/sin[position_ids[t]]`` for the
active tokens (golden: ``goldens.rope.materialize_rope_rows``).

Contract: rows ``t < num_tokens`` receive the table row of ``position_ids[t]``, or the
identity rotation (cos 1, sin 0) when the position is negative; rows ``t >= num_tokens``
are untouched (their bytes stay whatever the caller put there); ``num_tokens == 0`` touches
nothing.  A position at or past the table capacity is a host error: the caller validates
``position_ids`` before launch (``harness.entries.rope_rows`` raises ValueError naming
the field).  The kernel clamps only downward (``max(position, 0)``), so that host check is
what keeps every gather inside the table; padding positions (rows >= num_tokens) are never
read (a gather past the table aborts the interpreter with GATHEROpError).

ABI
---
=============  ======================  ========  =====
name           shape                   dtype     role
=============  ======================  ========  =====
freqs_cos      (capacity, half)        float32   in
freqs_sin      (capacity, half)        float32   in
position_ids   (tokens,)               int32     in
num_tokens     (1,)                    int32     in
rope_cos       (tokens, half)          float32   inout
rope_sin       (tokens, half)          float32   inout
=============  ======================  ========  =====

``half = config.rope.rope_dim // 2``; ``tokens`` from ``case["tokens"]`` (a dynamic axis);
``capacity`` from ``case["capacity"]`` when given, else ``default_capacity(config)``.

``num_tokens`` is a runtime value, passed as an INT32 ``[1]`` tensor (the platform passes
tensors only).  The kernel reads it with ``num_tokens[0]`` (pypto ``GetTensorData``) and
iterates only over the row tiles below it; the last tile's ``valid_shape`` stops the write
at row ``num_tokens - 1``, so rows at or past ``num_tokens`` are never written.

Gather: ``index_select`` on ``max(position, 0)`` (a -1 index aborts the interpreter), then
an FP32 select (``where(position >= 0, row, identity)``) with the comparison made in FP32
(``pypto.ge`` rejects int tensors).
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, case_int, jit_options, resolve
from v41.subgraph import one_subgraph

# rows per loop iteration, each iteration ONE task (see _row_tile): FLASH T=192 (150 active)
# 96 rows 1.63 us (2 tasks), 64 rows 1.68, 128 rows 1.69, 192 rows 1.70; T=4096 (4000 active)
# 96 rows 2.30 us, 128 rows 2.36, 64 rows 6.33, 32 rows 10.4 (the tasks queue on dispatch)
ROW_TILE = 96

VARIANTS = {
    "reference": "the contract",
    # Deliberately wrong variants, used to prove that the comparison can fail:
    "wrap_negative": "negative positions index from the table end (capacity + position), "
                     "torch style, instead of giving the identity rotation",
    "off_by_one": "gathers the row of position + 1 (clamped to the table)",
    "all_rows": "writes every row, also rows at or past num_tokens (indices clamped to the "
                "table so that padding positions past it can be gathered)",
}

ABI = (
    Arg("freqs_cos", ("capacity", "half"), "float32", "in"),
    Arg("freqs_sin", ("capacity", "half"), "float32", "in"),
    Arg("position_ids", ("tokens",), "int32", "in"),
    Arg("num_tokens", (1,), "int32", "in"),
    Arg("rope_cos", ("tokens", "half"), "float32", "inout"),
    Arg("rope_sin", ("tokens", "half"), "float32", "inout"),
)


def default_capacity(config) -> int:
    """Table rows used when a case names none: enough for the longest prefill, twice over."""
    return min(config.rope.max_position, 2 * config.cache.prefill_max_tokens)


def dims(config, case: dict) -> dict[str, int]:
    """Named dimensions of one launch; raises ValueError naming the bad field."""
    tokens = case_int(case, "tokens", minimum=1)
    capacity = case_int(case, "capacity", default_capacity(config), minimum=1)
    if capacity > config.rope.max_position:
        raise ValueError(f"case['capacity']: {capacity} > max_position {config.rope.max_position}")
    return {"tokens": tokens, "capacity": capacity, "half": config.rope.rope_dim // 2}


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def _row_tile(pypto, start, active, rows, half, capacity, position_ids, freqs_cos, freqs_sin,
              rope_cos, rope_sin, shift, identity, all_rows):
    """Rows ``start .. start + rows - 1`` (clipped at ``active``) of both outputs, traced as
    one subgraph: left to the partitioner, one iteration was 6 tasks in a chain of 3 (the
    clamped index, then the two gathers, then the two selects and writes), and each link
    waited ~7 k cycles on its producer (FLASH T=192 12.3 us; one subgraph: 1.6 us)."""
    with one_subgraph(pypto):
        valid = (active - start).min(rows)
        pos = pypto.view(position_ids, [rows], [start], valid_shape=[valid])
        if identity:
            safe = pypto.maximum(pos, 0)
        else:
            posw = pypto.cast(pos, pypto.DT_FP32)
            neg = pypto.minimum(pypto.maximum(pypto.mul(posw, -1.0), 0.0), 1.0)  # 1 if < 0
            posw = pypto.add(posw, pypto.mul(neg, float(capacity)))
            safe = pypto.cast(posw, pypto.DT_INT32)
        if shift:
            safe = pypto.add(safe, 1)
        if shift or all_rows:  # keep the wrong variants inside the table
            safe = pypto.minimum(safe, capacity - 1)
        cos_rows = pypto.index_select(freqs_cos, 0, safe)
        sin_rows = pypto.index_select(freqs_sin, 0, safe)
        if identity:
            posf = pypto.reshape(pypto.cast(pos, pypto.DT_FP32), [rows, 1],
                                 valid_shape=[valid, 1])
            keep = pypto.expand_clone(pypto.ge(posf, 0.0), [rows, half],
                                      valid_shape=[valid, half])
            cos_rows = pypto.where(keep, cos_rows, 1.0)
            sin_rows = pypto.where(keep, sin_rows, 0.0)
        pypto.assemble(cos_rows, [start, 0], rope_cos)
        pypto.assemble(sin_rows, [start, 0], rope_sin)


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos,
    rope_sin)`` for ``config`` and ``case`` (capacity fixed, tokens dynamic)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {sorted(VARIANTS)}")
    import pypto  # noqa: PLC0415  (deferred: the platform picks the pypto build)

    d = dims(config, case or {"tokens": 1})
    capacity, half = d["capacity"], d["half"]
    rows = ROW_TILE
    shift = variant == "off_by_one"  # a bool: the jit parser rejects int conditions
    identity = variant != "wrap_negative"
    all_rows = variant == "all_rows"
    options = jit_options(runtime_options)
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=options)
    def rope_rows(
        freqs_cos: pypto.Tensor([capacity, half], pypto.DT_FP32),
        freqs_sin: pypto.Tensor([capacity, half], pypto.DT_FP32),
        position_ids: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        rope_cos: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
        rope_sin: pypto.Tensor([tokens_dim, half], pypto.DT_FP32),
    ):
        if all_rows:
            active = position_ids.shape[0]
        else:
            active = num_tokens[0]
        pypto.set_vec_tile_shapes(rows, half)
        for i in pypto.loop((active + rows - 1) // rows, name="ROPE_ROWS", idx_name="r"):
            _row_tile(pypto, i * rows, active, rows, half, capacity, position_ids, freqs_cos,
                      freqs_sin, rope_cos, rope_sin, shift, identity, all_rows)

    return rope_rows
