"""``shared_expert``: v41.shared_expert (MXFP8 SwiGLU expert, weights decoded in-kernel)
against ``goldens.moe.shared_expert`` on the active rows.

Fixture (deterministic in the seed): BF16 ``x`` rows of unit scale; the shared expert's
checkpoint MXFP8 weights (``goldens.moe.quantize_shared_expert``: E4M3 payloads carried as
uint8 codes, uint8 E8M0 32x32 block scales).  W1 and W3 are scaled so that ``g`` and ``u``
have a standard deviation of about :data:`GATE_STD`: a sizeable share of them lies past
``swiglu_limit`` on both sides, so the clamps change the result.  Rows at or past
``case.active`` (the runtime ``num_tokens``) are padding: their ``x`` is NaN (never read
by the kernel, never given to the golden).

Comparison: the active rows of ``y`` with the contract's per-row bound and the sentinel
check; padding rows on their own, exactly zero.

Host validation (:func:`validate_launch`, before any launch): dtype and shape of every
kernel input named with what it must be, ``num_tokens`` INT32 ``[1]`` in ``[0, T]``, no
E8M0 NaN code (255) in a scale, finite active ``x`` rows.

a5sim: the SUT launches host chunks of at most :data:`A5SIM_CHUNK` tokens (the kernel is
row-independent), each with its share of the active prefix; their estimated times add.
An estimate-only platform (no interpreter) gets one launch of every token, as a card
would run it.
"""

from __future__ import annotations

import torch

from goldens.moe import ExpertWeights, quantize_shared_expert, shared_expert
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.entries._kernel import active_count, launch_step, sequential_cost
from harness.entries.index_query import chunks
from harness.fixtures import SENTINEL, generator, randn, sentinel
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.shared_expert"
SUPPORT = Support(phase="prefill", inactive_rows=True)
A5SIM_CHUNK = 32  # tokens per a5sim launch
GATE_STD = 8.0  # standard deviation of g and u: |g| > limit 10 for ~21 % of them
MX = 32
WEIGHTS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


def build_inputs(config, case):
    d, i = config.hidden_size, config.moe.intermediate_size
    t, n = case.tokens, case.active
    g = generator(case.seed, "shared_expert")
    ew = quantize_shared_expert(torch.randn(i, d, generator=g) * GATE_STD * d ** -0.5,
                                torch.randn(i, d, generator=g) * GATE_STD * d ** -0.5,
                                torch.randn(d, i, generator=g) * i ** -0.5)
    x = randn((t, d), case.seed, "x").to(torch.bfloat16)
    x[n:] = float("nan")  # padding rows: never read
    return {"x": x, "num_tokens": torch.tensor([n], dtype=torch.int32),
            "w1": ew.w1.view(torch.uint8), "w1_scale": ew.w1_scale,
            "w3": ew.w3.view(torch.uint8), "w3_scale": ew.w3_scale,
            "w2": ew.w2.view(torch.uint8), "w2_scale": ew.w2_scale,
            "y": sentinel((t, d))}


def _weights(inputs) -> ExpertWeights:
    fp8 = torch.float8_e4m3fn
    return ExpertWeights(inputs["w1"].view(fp8), inputs["w1_scale"], inputs["w3"].view(fp8),
                         inputs["w3_scale"], inputs["w2"].view(fp8), inputs["w2_scale"])


def validate_launch(config, inputs) -> int:
    """Host check before any launch: every kernel input's and the output buffer's dtype and
    shape (named with what it must be), ``num_tokens`` INT32 ``[1]`` in ``[0, T]``, no E8M0
    NaN code in a scale, finite active ``x`` rows.  Returns ``num_tokens``; raises
    ValueError naming the field and the bound."""
    d, i = config.hidden_size, config.moe.intermediate_size
    x = inputs["x"]
    t = x.shape[0] if x.dim() == 2 else 0
    if t < 1 or x.dtype != torch.bfloat16 or x.shape[1] != d:
        raise ValueError(f"x: must be torch.bfloat16 [T >= 1, {d}], got {x.dtype} "
                         f"{list(x.shape)}")
    want = {"w1": (i, d), "w1_scale": (i // MX, d // MX), "w3": (i, d),
            "w3_scale": (i // MX, d // MX), "w2": (d, i), "w2_scale": (d // MX, i // MX)}
    for name, shape in want.items():
        v = inputs[name]
        if tuple(v.shape) != shape or v.dtype != torch.uint8:
            raise ValueError(f"{name}: must be torch.uint8 {list(shape)}, got {v.dtype} "
                             f"{list(v.shape)}")
    y = inputs["y"]
    if tuple(y.shape) != (t, d) or y.dtype != torch.bfloat16:
        raise ValueError(f"y: must be torch.bfloat16 {[t, d]}, got {y.dtype} {list(y.shape)}")
    n = active_count(inputs["num_tokens"], t)
    for name in ("w1_scale", "w3_scale", "w2_scale"):
        if int(inputs[name].max()) == 255:
            raise ValueError(f"{name}: contains E8M0 code 255 (NaN); codes must be <= 254")
    if not bool(torch.isfinite(x[:n]).all()):
        raise ValueError(f"x: an active row (< num_tokens={n}) contains NaN or Inf; values "
                         f"must be finite")
    return n


def kernel_sut(variant: str = "reference", chunk: int = A5SIM_CHUNK, i_tile: int | None = None,
               rows_per_tile: int | None = None):
    """The SUT: host validation, then one launch per host chunk of ``chunk`` tokens
    (``i_tile`` overrides the kernel's intermediate column tile, ``rows_per_tile`` its row
    tile: tests run several row tiles in one small launch)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        n = validate_launch(config, inputs)
        t = inputs["x"].shape[0]
        options = {} if variant == "reference" else {"variant": variant}
        if rows_per_tile is not None:
            options["rows_per_tile"] = rows_per_tile
        if i_tile is not None:
            options["i_tile"] = i_tile
        records = []
        # the cost model alone needs no interpreter memory: one launch, weights decoded once
        step = launch_step(platform, t, chunk)
        for t0, rows, active in chunks(t, n, step):
            program = platform.compile(KernelSpec(MODULE, options), config, {"tokens": rows})
            part = {name: inputs[name] for name in WEIGHTS}
            part["x"] = inputs["x"][t0:t0 + rows].contiguous()
            part["num_tokens"] = torch.tensor([active], dtype=torch.int32)
            part["y"] = torch.full((rows, config.hidden_size), SENTINEL, dtype=torch.bfloat16)
            for name, width in (("xq", config.hidden_size),  # kernel scratch, not compared
                                ("h_mx", config.moe.intermediate_size)):
                part[name] = torch.full((rows, width), SENTINEL, dtype=torch.bfloat16)
            result = platform.launch(program, 0, part)
            result.raise_for_error()
            inputs["y"][t0:t0 + rows].copy_(result.outputs["y"])
            record = result.cost_record()
            if record:
                records.append(record)
        return SutOutput({"y": inputs["y"]}, [sequential_cost(records)] if records else [])
    return run


def work(config, case, inputs):
    """One launch of every token, as a card runs it (a5sim's interpreter chunks re-read the
    weights; that shows as a higher ratio at the tensor level): the active ``x`` rows read,
    the three weights with their scales read once, every ``y`` row written (padding as
    zeros), the ``xq`` / ``h_mx`` scratch rows written and read back.  Cube BF16 FLOPs: the
    three products of the active rows (the MX products run as BF16 here); vector: about 24
    operations per decoded weight element (each decoded once), 40 per quantized ``x`` and
    ``h`` element, 8 per SwiGLU element."""
    d, i = config.hidden_size, config.moe.intermediate_size
    n = int(inputs["num_tokens"][0])
    weights = tensor_bytes(*(inputs[name] for name in WEIGHTS))
    moved = n * d * 2 + weights + 4 + tensor_bytes(inputs["y"]) + 2 * n * (d + i) * 2
    flops = 2 * n * 3 * d * i
    vector = 24 * 3 * d * i + 40 * n * (d + i) + 8 * n * i
    return Work(moved, {CUBE_BF16: flops, VECTOR_FP32: vector})


def golden(config, case, inputs):
    n, x = int(inputs["num_tokens"][0]), inputs["x"]
    y = torch.zeros(x.shape, dtype=torch.bfloat16)
    if n:
        y[:n] = shared_expert(x[:n], _weights(inputs), config)
    return {"y": y}


def compare(config, case, inputs, gold, actual):
    n, t = int(inputs["num_tokens"][0]), inputs["x"].shape[0]
    verdicts = []
    if n:  # active rows
        a, g = actual["y"][:n], gold["y"][:n]
        verdicts += check_row_bound("y", a, g) + check_sentinel("y", a, SENTINEL, ref=g)
    return verdicts + check_zero_rows("y", actual["y"], rows=slice(n, t))  # padding rows


ENTRY = register(Entry(
    name="shared_expert",
    description="MoE shared expert: clamped SwiGLU with MXFP8 W1/W3/W2 decoded in-kernel, "
                "MX(x) and MX(h) activations; rows >= num_tokens zero",
    support=SUPPORT,
    matrix=(Case(entry="shared_expert", tokens=21),
            Case(entry="shared_expert", tokens=50, active_tokens=37, seed=5)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut(chunk=1 << 30)},
    work=work,
))
