"""``index_query``: v41.index_query (the lightning indexer's query ``MX(qr) @ wq_b`` with
RoPE on each head's tail, and the scaled head weights ``x @ weights_proj``) against
``goldens.indexer.index_query``.

Fixture (deterministic in the seed): BF16 ``qr`` and ``x`` rows, the index ``wq_b`` as a
checkpoint FP8 linear (``goldens.quant.quantize_fp8_weight``: uint8 E4M3 codes and uint8
E8M0 32x32 block scales), BF16 ``weights_proj``; positions drawn from ``[0, POSITIONS)``
with some negative (identity rotation).  The kernel's rope rows are built the way the
``rope_rows`` kernel builds them: ``goldens.rope.materialize_rope_rows`` from the
COMPRESSED profile's tables into a sentinel-filled buffer, so padding rows (at or past
``case.active``, the runtime ``num_tokens``) keep the sentinel and their positions lie
past the table; the golden gets the tables and positions themselves.

Comparison: every active row of ``q`` (one row per (token, head): row ``t * H + h``) and of
``weights`` with the contract's per-row bound and the sentinel check (an unwritten row
fails); padding rows of both outputs on their own, exactly zero.

Host validation (:func:`validate_launch`, before any launch): dtype and shape of every
input and output buffer named with what it must be, ``num_tokens`` INT32 ``[1]`` in ``[0,
T]``, no E8M0 NaN code (255) in ``wq_b_scale``, finite active rows.

a5sim: the SUT launches host chunks of at most :data:`A5SIM_CHUNK` tokens (one launch of
every token on an estimate-only platform, which interprets nothing; the kernel is
row-independent); each chunk's ``num_tokens`` is its share of the active prefix, and the
chunks' estimated times add (``sequential_cost``).  One FLASH launch of 192 tokens passed
9 GB of interpreter within 90 s with 32-row tiles (stopped); 64 tokens take ~3 GB and ~35 s;
the worker kept ~0.8 GB per FLASH launch until it was replaced (``V41_WORKER_JOBS``,
default 16: a 1024-token case passed 12 GB after ~9 launches, with 32-row tiles), so the
prefill slow case is 512 tokens (eight launches; peak 4.9 GB with ``V41_WORKER_JOBS=4``).
"""

from __future__ import annotations

import torch

from goldens.indexer import index_query
from goldens.quant import quantize_fp8_weight
from goldens.rope import materialize_rope_rows, precompute_rope_tables
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.entries._kernel import active_count, launch_step, sequential_cost
from harness.fixtures import SENTINEL, generator, randn, sentinel
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.index_query"
SUPPORT = Support(phase="prefill", inactive_rows=True)
A5SIM_CHUNK = 64  # tokens per a5sim launch (FLASH: ~3 GB of interpreter and ~35 s each)
POSITIONS = 4096  # rope table capacity; positions drawn from [0, POSITIONS)
MX = 32
OUTPUTS = ("q", "weights")
ROW_INPUTS = ("qr", "rope_cos", "rope_sin", "x")  # per-token kernel inputs (host-chunked)


def build_inputs(config, case):
    ix, ql, d = config.index, config.q_lora_rank, config.hidden_size
    t, n, seed = case.tokens, case.active, case.seed
    heads, qw, half = ix.n_heads, ix.n_heads * ix.head_dim, config.rope_dim // 2
    g = generator(seed, "index_weights")
    wq_b, wq_b_scale = quantize_fp8_weight(torch.randn(qw, ql, generator=g) * ql ** -0.5)
    proj = (torch.randn(d, heads, generator=g) * d ** -0.5).to(torch.bfloat16)
    cos, sin = precompute_rope_tables(config, True, POSITIONS)
    pos = torch.randint(0, POSITIONS, (t,), generator=generator(seed, "positions"),
                        dtype=torch.int32)
    pos[::5] = -1  # identity rotation
    pos[3::7] = -9
    pos[n:] = POSITIONS + 1000  # padding: past the table, never read
    rope_cos = torch.full((t, half), SENTINEL, dtype=torch.float32)
    rope_sin = torch.full((t, half), SENTINEL, dtype=torch.float32)
    materialize_rope_rows(cos, sin, pos, n, rope_cos, rope_sin)
    return {"qr": randn((t, ql), seed, "qr").to(torch.bfloat16),
            "rope_cos": rope_cos, "rope_sin": rope_sin,
            "wq_b": wq_b.view(torch.uint8), "wq_b_scale": wq_b_scale,
            "x": randn((t, d), seed, "x").to(torch.bfloat16), "weights_proj": proj,
            "num_tokens": torch.tensor([n], dtype=torch.int32),
            "position_ids": pos, "freqs_cos": cos, "freqs_sin": sin,
            "q": sentinel((t, qw)), "weights": sentinel((t, heads))}


def validate_launch(config, inputs) -> int:
    """Host check before any launch: every kernel input's and output buffer's dtype and
    shape (named with what it must be), ``num_tokens`` INT32 ``[1]`` in ``[0, T]``, no E8M0
    NaN code in ``wq_b_scale``, finite active rows and ``weights_proj``.  Returns
    ``num_tokens``; raises ValueError naming the field and the bound."""
    ix, ql, d = config.index, config.q_lora_rank, config.hidden_size
    qw, half = ix.n_heads * ix.head_dim, config.rope_dim // 2
    qr = inputs["qr"]
    t = qr.shape[0] if qr.dim() == 2 else 0
    if t < 1 or qr.dtype != torch.bfloat16 or qr.shape[1] != ql:
        raise ValueError(f"qr: must be torch.bfloat16 [T >= 1, {ql}], got {qr.dtype} "
                         f"{list(qr.shape)}")
    want = {"rope_cos": ((t, half), torch.float32), "rope_sin": ((t, half), torch.float32),
            "wq_b": ((qw, ql), torch.uint8), "wq_b_scale": ((qw // MX, ql // MX), torch.uint8),
            "x": ((t, d), torch.bfloat16), "weights_proj": ((d, ix.n_heads), torch.bfloat16),
            "q": ((t, qw), torch.bfloat16), "weights": ((t, ix.n_heads), torch.bfloat16)}
    for name, (shape, dtype) in want.items():
        v = inputs[name]
        if tuple(v.shape) != shape or v.dtype != dtype:
            raise ValueError(f"{name}: must be {dtype} {list(shape)}, got {v.dtype} "
                             f"{list(v.shape)}")
    n = active_count(inputs["num_tokens"], t)
    if int(inputs["wq_b_scale"].max()) == 255:
        raise ValueError("wq_b_scale: contains E8M0 code 255 (NaN); codes must be <= 254")
    for name in ROW_INPUTS:
        if not bool(torch.isfinite(inputs[name][:n]).all()):
            raise ValueError(f"{name}: an active row (< num_tokens={n}) contains NaN or Inf; "
                             f"values must be finite")
    if not bool(torch.isfinite(inputs["weights_proj"]).all()):
        raise ValueError("weights_proj: contains NaN or Inf; values must be finite")
    return n


def chunks(tokens: int, active: int, chunk: int) -> list[tuple[int, int, int]]:
    """Host launches ``(t0, rows, num_tokens)``: ``chunk`` rows at a time, each with its
    share of the active prefix."""
    return [(t0, min(chunk, tokens - t0), max(0, min(chunk, tokens - t0, active - t0)))
            for t0 in range(0, tokens, chunk)]


def kernel_sut(variant: str = "reference", chunk: int = A5SIM_CHUNK,
               rows_per_tile: int | None = None):
    """The SUT: host validation, then one launch per host chunk of ``chunk`` tokens.
    ``rows_per_tile`` overrides the kernel's row tile (tests: several row tiles in one small
    launch)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        n = validate_launch(config, inputs)
        t = inputs["qr"].shape[0]
        options = {} if variant == "reference" else {"variant": variant}
        if rows_per_tile is not None:
            options["rows_per_tile"] = rows_per_tile
        records = []
        step = launch_step(platform, t, chunk)
        for t0, rows, active in chunks(t, n, step):
            program = platform.compile(KernelSpec(MODULE, options), config, {"tokens": rows})
            part = {a.name: inputs[a.name] for a in program.args if a.role == "in"}
            for name in ROW_INPUTS:
                part[name] = inputs[name][t0:t0 + rows].contiguous()
            part["num_tokens"] = torch.tensor([active], dtype=torch.int32)
            for a in program.args:
                if a.role == "out":
                    part[a.name] = torch.full(a.shape, SENTINEL, dtype=a.torch_dtype)
            result = platform.launch(program, 0, part)
            result.raise_for_error()
            for name in OUTPUTS:
                inputs[name][t0:t0 + rows].copy_(result.outputs[name])
            record = result.cost_record()
            if record:
                records.append(record)
        return SutOutput({name: inputs[name] for name in OUTPUTS},
                         [sequential_cost(records)] if records else [])
    return run


def work(config, case, inputs):
    """One launch of every token, as a card runs it (a5sim's interpreter chunks re-read
    ``wq_b``; that shows as a higher ratio at the tensor level): the active rows of ``qr``,
    ``x`` and the rope rows read, ``wq_b`` with its scales and ``weights_proj`` read once,
    every row of ``q`` and ``weights`` written (padding rows as zeros), the ``qrq`` scratch
    written and read back.  Cube BF16 FLOPs: the two products and the RoPE's 0/1 matmuls of
    the active rows; vector: about 24 operations per decoded weight element (decoded once)
    and 40 per quantized ``qr`` element."""
    ix, ql, d, rd = config.index, config.q_lora_rank, config.hidden_size, config.rope_dim
    heads, qw = ix.n_heads, ix.n_heads * ix.head_dim
    n = int(inputs["num_tokens"][0])
    row = sum(tensor_bytes(inputs[name][0]) for name in ROW_INPUTS)
    weights = tensor_bytes(inputs["wq_b"], inputs["wq_b_scale"], inputs["weights_proj"])
    written = tensor_bytes(inputs["q"], inputs["weights"])
    moved = n * row + weights + written + 4 + 2 * 2 * n * ql
    rope = 2 * heads * (2 * (rd // 2) * rd + rd * rd)  # cos/sin expand and pair swap
    flops = 2 * n * (ql * qw + d * heads) + n * rope
    vector = 24 * qw * ql + 40 * n * ql
    return Work(moved, {CUBE_BF16: flops, VECTOR_FP32: vector})


def golden(config, case, inputs):
    res = index_query(config, inputs["qr"], inputs["wq_b"].view(torch.float8_e4m3fn),
                      inputs["wq_b_scale"], inputs["x"], inputs["weights_proj"],
                      inputs["position_ids"], int(inputs["num_tokens"][0]), inputs["freqs_cos"],
                      inputs["freqs_sin"])
    return {"q": res.q.reshape(res.q.shape[0], -1), "weights": res.weights}


def compare(config, case, inputs, gold, actual):
    n, t = int(inputs["num_tokens"][0]), inputs["qr"].shape[0]
    dh = config.index.head_dim
    verdicts = []
    if n:  # active rows: q one row per (token, head), weights one row per token
        pairs = (("q", actual["q"][:n].reshape(-1, dh), gold["q"][:n].reshape(-1, dh)),
                 ("weights", actual["weights"][:n], gold["weights"][:n]))
        for name, a, g in pairs:
            verdicts += check_row_bound(name, a, g) + check_sentinel(name, a, SENTINEL, ref=g)
    for name in OUTPUTS:  # padding rows: exactly zero
        verdicts += check_zero_rows(name, actual[name], rows=slice(n, t))
    return verdicts


ENTRY = register(Entry(
    name="index_query",
    description="indexer query: MX(qr) @ wq_b (MXFP8 weight decoded in-kernel) with RoPE on "
                "each head's tail from prepared compressed-profile rope rows, and head weights "
                "[x @ weights_proj] * Dh^-0.5 * H^-0.5; rows >= num_tokens zero",
    support=SUPPORT,
    matrix=(Case(entry="index_query", tokens=21, active_tokens=18),
            Case(entry="index_query", tokens=90, active_tokens=77, seed=5),
            Case(entry="index_query", tokens=9)),
    slow_cases=(Case(entry="index_query", tokens=192, active_tokens=190, preset="flash"),
                Case(entry="index_query", tokens=512, active_tokens=500, preset="flash",
                     seed=3)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut(chunk=1 << 30)},
    work=work,
))
