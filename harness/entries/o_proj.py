"""``o_proj``: v41.o_proj (one TP rank's FP32 partial: inverse RoPE of its heads, grouped
``wo_a``, MXFP8 ``wo_b``) on every rank, the all-reduce on the host transport, against
``goldens.o_proj``.

Fixture (deterministic in the seed): BF16 attention rows of all heads, rope rows of random
positions (FP32 table rows, ``goldens.rope``), the golden's random weights
(``random_o_weights``: BF16 ``wo_a``, checkpoint FP8 ``wo_b`` carried as uint8 E4M3 codes
with uint8 E8M0 block scales).  Outputs: ``partials`` FP32 ``[tp, T, hidden]`` (each
rank's kernel output) and ``out`` BF16 ``[T, hidden]``, the rank-ordered FP32 sum with one
BF16 cast (``TpGroup.publish_reduce`` / ``all_reduce``).  Both are compared with the
contract's per-row bound (every rank's partial row by row, and the reduced output) and
checked for missing writes.

Host validation (:func:`validate_launch`, before any launch): dtype and shape of every
input named with what it must be, and no E8M0 NaN code (255) in ``wo_b_scale``.

a5sim: a launch holds every loop iteration's data; the SUT launches each rank on host
chunks of at most :data:`A5SIM_CHUNK` tokens (the kernel is row-independent); an
estimate-only platform (no interpreter) gets one launch of every token, as a card would.
"""

from __future__ import annotations

import torch

from goldens.config import local_heads
from goldens.o_proj import OWeights, o_proj_partial, random_o_weights, tp_reduce
from goldens.rope import precompute_rope_tables
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel
from harness.fixtures import SENTINEL, generator, randn, sentinel
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes
from harness.transport import TpGroup

MODULE = "v41.o_proj"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 2, 4))
A5SIM_CHUNK = 32  # tokens per a5sim launch (FLASH: ~85 MB of interpreter per token)
POSITIONS = 4096  # rope positions drawn from [0, POSITIONS)
MX = 32


def build_inputs(config, case):
    t, h, hd = case.tokens, config.num_heads, config.head_dim
    attn = randn((t, h, hd), case.seed, "attn_out").to(torch.bfloat16)
    cos, sin = precompute_rope_tables(config, False, POSITIONS)
    pos = torch.randint(0, POSITIONS, (t,), generator=generator(case.seed, "positions"))
    w = random_o_weights(config, generator(case.seed, "o_weights"))
    return {"attn_out": attn, "rope_cos": cos[pos].contiguous(), "rope_sin": sin[pos].contiguous(),
            "wo_a": w.wo_a, "wo_b": w.wo_b.view(torch.uint8), "wo_b_scale": w.wo_b_scale,
            "partials": sentinel((case.tp, t, config.hidden_size), torch.float32),
            "out": sentinel((t, config.hidden_size), torch.bfloat16)}


def _weights(inputs) -> OWeights:
    return OWeights(inputs["wo_a"], inputs["wo_b"].view(torch.float8_e4m3fn), inputs["wo_b_scale"])


def validate_launch(config, case, inputs) -> None:
    """Host check before any launch: every input's dtype and shape (named with what it must
    be) and no E8M0 NaN code in ``wo_b_scale``; raises ValueError."""
    t = inputs["attn_out"].shape[0] if inputs["attn_out"].dim() else 0
    g, r, gi = config.o_groups, config.o_lora_rank, config.o_group_in
    want = {"attn_out": ((t, config.num_heads, config.head_dim), torch.bfloat16),
            "rope_cos": ((t, config.rope_dim // 2), torch.float32),
            "rope_sin": ((t, config.rope_dim // 2), torch.float32),
            "wo_a": ((g, r, gi), torch.bfloat16),
            "wo_b": ((config.hidden_size, g * r), torch.uint8),
            "wo_b_scale": ((config.hidden_size // MX, g * r // MX), torch.uint8)}
    if t < 1:
        raise ValueError(f"attn_out: must be bfloat16 [T >= 1, {config.num_heads}, "
                         f"{config.head_dim}], got {tuple(inputs['attn_out'].shape)}")
    for name, (shape, dtype) in want.items():
        x = inputs[name]
        if tuple(x.shape) != shape or x.dtype != dtype:
            raise ValueError(f"{name}: must be {dtype} {list(shape)}, got {x.dtype} "
                             f"{list(x.shape)}")
    if int(inputs["wo_b_scale"].max()) == 255:
        raise ValueError("wo_b_scale: contains E8M0 code 255 (NaN); codes must be <= 254")
    for name in ("attn_out", "rope_cos", "rope_sin", "wo_a"):
        if not bool(torch.isfinite(inputs[name]).all()):
            raise ValueError(f"{name}: contains NaN or Inf; values must be finite")


def rank_inputs(config, tp: int, rank: int, inputs) -> dict:
    """The kernel arguments of rank ``rank`` (its heads and its weight shard, flattened)."""
    lh = local_heads(config, tp)
    w = _weights(inputs).shard(config, tp, rank)
    t = inputs["attn_out"].shape[0]
    return {"attn_out": inputs["attn_out"][:, rank * lh:(rank + 1) * lh].reshape(t, -1)
            .contiguous(),
            "rope_cos": inputs["rope_cos"], "rope_sin": inputs["rope_sin"],
            "wo_a": w.wo_a.reshape(-1, config.o_group_in).contiguous(),
            "wo_b": w.wo_b.view(torch.uint8).contiguous(), "wo_b_scale": w.wo_b_scale.contiguous()}


def kernel_sut(variant: str = "reference", chunk: int = A5SIM_CHUNK,
               rows_per_tile: int | None = None):
    """The SUT: host validation, then every rank's launches (host token chunks of
    ``chunk``), then the rank-ordered all-reduce on the host transport.  ``rows_per_tile``
    overrides the kernel's row tile (tests: several row tiles in one small launch)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, case, inputs)
        t, tp, hidden = inputs["attn_out"].shape[0], case.tp, config.hidden_size
        options = {} if variant == "reference" else {"variant": variant}
        if rows_per_tile is not None:
            options["rows_per_tile"] = rows_per_tile
        group = TpGroup(tp, t, hidden)
        partials = inputs["partials"]
        records = []
        for rank in range(tp):
            args = rank_inputs(config, tp, rank, inputs)
            chunks = []  # this rank's cost records, one per host chunk
            step = launch_step(platform, t, chunk)
            for t0 in range(0, t, step):
                n = min(step, t - t0)
                program = platform.compile(KernelSpec(MODULE, options), config,
                                           {"tokens": n, "tp": tp})
                part = {a: (v[t0:t0 + n].contiguous() if a in ("attn_out", "rope_cos",
                                                                "rope_sin") else v)
                        for a, v in args.items()}
                part["partial"] = torch.full((n, hidden), SENTINEL, dtype=torch.float32)
                part["lat_mx"] = torch.full((n, args["wo_b"].shape[1]), SENTINEL,
                                            dtype=torch.bfloat16)  # kernel scratch
                part["lat_pre"] = torch.full((n, args["wo_b"].shape[1]), SENTINEL,
                                             dtype=torch.bfloat16)  # kernel scratch
                result = platform.launch(program, rank, part)
                result.raise_for_error()
                partials[rank, t0:t0 + n] = result.outputs["partial"]
                record = result.cost_record()
                if record:
                    chunks.append(record)
            if chunks:
                records.append(sequential_cost(chunks))
            group.publish_reduce(rank, 1, partials[rank])
        return SutOutput({"partials": partials, "out": group.all_reduce(1, t)}, records)
    return run


def work(config, case, inputs):
    """One rank's launch of every token, as a card runs it (the estimate is the slowest
    rank's; a5sim's interpreter chunks re-read ``wo_b``, which shows as a higher ratio at
    the tensor level): its heads' attention rows, the rope rows, its ``wo_a`` groups and
    ``wo_b`` columns with their scales, its FP32 partial written, the ``lat_mx`` scratch
    written and read back; cube BF16 FLOPs of its ``wo_a`` and ``wo_b`` products (the MX
    products run as BF16 here); vector: about 24 operations per decoded ``wo_b`` element
    (decoded once) and 40 per latent element (MXFP8)."""
    t, tp = case.tokens, case.tp
    lat = config.o_groups * config.o_lora_rank // tp
    width = config.num_heads // tp * config.head_dim
    moved = (tensor_bytes(inputs["rope_cos"], inputs["rope_sin"])
             + tensor_bytes(inputs["attn_out"], inputs["wo_a"], inputs["wo_b"],
                            inputs["wo_b_scale"]) // tp + t * config.hidden_size * 4
             + 2 * t * lat * 2)
    flops = 2 * t * (width * config.o_lora_rank + lat * config.hidden_size)
    vector = 24 * config.hidden_size * lat + 40 * t * lat + 8 * t * width
    return Work(moved, {CUBE_BF16: flops, VECTOR_FP32: vector})


def golden(config, case, inputs):
    w, tp = _weights(inputs), case.tp
    lh = local_heads(config, tp)
    parts = [o_proj_partial(inputs["attn_out"][:, r * lh:(r + 1) * lh], inputs["rope_cos"],
                            inputs["rope_sin"], w.shard(config, tp, r), config)
             for r in range(tp)]
    return {"partials": torch.stack(parts), "out": tp_reduce(parts)}


def compare(config, case, inputs, gold, actual):
    verdicts = []
    for r in range(case.tp):
        name = f"partials[{r}]"
        verdicts += (check_row_bound(name, actual["partials"][r], gold["partials"][r])
                     + check_sentinel(name, actual["partials"][r], SENTINEL,
                                      ref=gold["partials"][r]))
    return verdicts + check_row_bound("out", actual["out"], gold["out"])


ENTRY = register(Entry(
    name="o_proj",
    description="output projection: inverse RoPE of each rank's heads, grouped wo_a, MXFP8 "
                "wo_b decoded in-kernel (FP32 partial per rank), rank-ordered FP32 all-reduce "
                "on the host with one BF16 cast",
    support=SUPPORT,
    matrix=(Case(entry="o_proj", tokens=21), Case(entry="o_proj", tokens=70, tp=2),
            Case(entry="o_proj", tokens=9, tp=4, seed=5)),
    slow_cases=(Case(entry="o_proj", tokens=192, tp=4, preset="flash"),
                Case(entry="o_proj", tokens=1024, tp=4, preset="flash", seed=3)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut(chunk=1 << 30)},
    work=work,
))
