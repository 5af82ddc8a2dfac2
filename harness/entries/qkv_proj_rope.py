"""``qkv_proj_rope``: v41.qkv_proj_rope (Q-A, q RMSNorm, Q-B of one rank's heads, KV, kv
RMSNorm, RoPE on the tails; MXFP8 weights decoded in-kernel) on every TP rank, against
``goldens.qkv.qkv_proj_rope``.

Fixture (deterministic in the seed): BF16 hidden rows, rope rows of random positions
(FP32 table rows, as ``rope_rows`` prepares them), the golden's random weights
(``random_qkv_weights``: checkpoint FP8 ``wq_a``, ``wq_b``, ``wkv`` carried as uint8 E4M3
codes with uint8 E8M0 block scales, FP32 norm weights).  Outputs: ``q`` BF16 ``[tp, T,
H/tp, head_dim]`` (each rank's heads), ``kv`` and ``qr`` BF16 ``[tp, T, width]`` (every
rank computes them; TP replicas).  Every rank's rows are compared with the contract's
per-row bound and checked for missing writes, and the replicated ``kv`` / ``qr`` must be
byte-identical across ranks.

Host validation (:func:`validate_launch`, before any launch): dtype and shape of every
input named with what it must be, no E8M0 NaN code (255) in a scale, finite activations.

a5sim: the SUT launches each rank on host chunks of at most :data:`A5SIM_CHUNK` tokens
(the kernel is row-independent); an estimate-only platform (no interpreter) gets one
launch of every token, as a card would run it.
"""

from __future__ import annotations

import torch

from goldens.config import local_heads
from goldens.qkv import QKVWeights, local_wq_b, qkv_proj_rope, random_qkv_weights
from goldens.rope import precompute_rope_tables
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel
from harness.fixtures import SENTINEL, generator, randn, sentinel
from harness.platforms.topology import CUBE_BF16, VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.qkv_proj_rope"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 2, 4))
A5SIM_CHUNK = 32  # tokens per a5sim launch (FLASH: ~85 MB of interpreter per token)
POSITIONS = 4096  # rope positions drawn from [0, POSITIONS)
MX = 32
FP8_WEIGHTS = ("wq_a", "wq_b", "wkv")
OUTPUTS = ("q", "kv", "qr")


def build_inputs(config, case):
    t, tp, hd = case.tokens, case.tp, config.head_dim
    x = randn((t, config.hidden_size), case.seed, "x").to(torch.bfloat16)
    cos, sin = precompute_rope_tables(config, False, POSITIONS)
    pos = torch.randint(0, POSITIONS, (t,), generator=generator(case.seed, "positions"))
    w = random_qkv_weights(config, generator(case.seed, "qkv_weights"))
    inputs = {"x": x, "rope_cos": cos[pos].contiguous(), "rope_sin": sin[pos].contiguous()}
    for name in FP8_WEIGHTS:
        inputs[name] = getattr(w, name).view(torch.uint8)
        inputs[f"{name}_scale"] = getattr(w, f"{name}_scale")
    inputs["q_norm"], inputs["kv_norm"] = w.q_norm, w.kv_norm
    inputs["q"] = sentinel((tp, t, local_heads(config, tp), hd))
    inputs["kv"] = sentinel((tp, t, hd))
    inputs["qr"] = sentinel((tp, t, config.q_lora_rank))
    return inputs


def _weights(inputs) -> QKVWeights:
    e4m3 = {n: inputs[n].view(torch.float8_e4m3fn) for n in FP8_WEIGHTS}
    return QKVWeights(e4m3["wq_a"], inputs["wq_a_scale"], inputs["q_norm"], e4m3["wq_b"],
                      inputs["wq_b_scale"], e4m3["wkv"], inputs["wkv_scale"], inputs["kv_norm"])


def validate_launch(config, case, inputs) -> None:
    """Host check before any launch: every input's dtype and shape (named with what it must
    be), no E8M0 NaN code in a scale, finite activations and norms; raises ValueError."""
    x = inputs["x"]
    t = x.shape[0] if x.dim() == 2 else 0
    d, ql, hd = config.hidden_size, config.q_lora_rank, config.head_dim
    qw = config.num_heads * hd
    want = {"x": ((t, d), torch.bfloat16),
            "rope_cos": ((t, config.rope_dim // 2), torch.float32),
            "rope_sin": ((t, config.rope_dim // 2), torch.float32),
            "wq_a": ((ql, d), torch.uint8), "wq_a_scale": ((ql // MX, d // MX), torch.uint8),
            "q_norm": ((ql,), torch.float32),
            "wq_b": ((qw, ql), torch.uint8), "wq_b_scale": ((qw // MX, ql // MX), torch.uint8),
            "wkv": ((hd, d), torch.uint8), "wkv_scale": ((hd // MX, d // MX), torch.uint8),
            "kv_norm": ((hd,), torch.float32)}
    if t < 1:
        raise ValueError(f"x: must be bfloat16 [T >= 1, {d}], got {tuple(x.shape)}")
    for name, (shape, dtype) in want.items():
        v = inputs[name]
        if tuple(v.shape) != shape or v.dtype != dtype:
            raise ValueError(f"{name}: must be {dtype} {list(shape)}, got {v.dtype} "
                             f"{list(v.shape)}")
    for name in FP8_WEIGHTS:
        if int(inputs[f"{name}_scale"].max()) == 255:
            raise ValueError(f"{name}_scale: contains E8M0 code 255 (NaN); codes must be <= 254")
    for name in ("x", "rope_cos", "rope_sin", "q_norm", "kv_norm"):
        if not bool(torch.isfinite(inputs[name]).all()):
            raise ValueError(f"{name}: contains NaN or Inf; values must be finite")


def rank_inputs(config, tp: int, rank: int, inputs) -> dict:
    """The kernel inputs of rank ``rank``: its ``wq_b`` rows, everything else replicated."""
    wq_b, wq_b_scale = local_wq_b(inputs["wq_b"], inputs["wq_b_scale"], config, tp, rank)
    args = {n: inputs[n] for n in ("x", "rope_cos", "rope_sin", "wq_a", "wq_a_scale",
                                    "q_norm", "wkv", "wkv_scale", "kv_norm")}
    args["wq_b"], args["wq_b_scale"] = wq_b.contiguous(), wq_b_scale.contiguous()
    return args


def kernel_sut(variant: str = "reference", chunk: int = A5SIM_CHUNK,
               rows_per_tile: int | None = None):
    """The SUT: host validation, then every rank's launches (host token chunks of
    ``chunk``). ``rows_per_tile``
    overrides the kernel's row tile (tests: several row tiles in one small launch)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, case, inputs)
        t, tp = inputs["x"].shape[0], case.tp
        options = {} if variant == "reference" else {"variant": variant}
        if rows_per_tile is not None:
            options["rows_per_tile"] = rows_per_tile
        records = []
        for rank in range(tp):
            args = rank_inputs(config, tp, rank, inputs)
            chunks = []  # this rank's cost records, one per host chunk
            step = launch_step(platform, t, chunk)
            for t0 in range(0, t, step):
                n = min(step, t - t0)
                program = platform.compile(KernelSpec(MODULE, options), config,
                                           {"tokens": n, "tp": tp})
                part = {a: (v[t0:t0 + n].contiguous() if a in ("x", "rope_cos", "rope_sin")
                            else v) for a, v in args.items()}
                for out in program.outputs:
                    a = next(x for x in program.args if x.name == out)
                    part[out] = torch.full(a.shape, SENTINEL, dtype=a.torch_dtype)
                result = platform.launch(program, rank, part)
                result.raise_for_error()
                for out in OUTPUTS:
                    dst = inputs[out][rank, t0:t0 + n]
                    dst.copy_(result.outputs[out].reshape(dst.shape))
                record = result.cost_record()
                if record:
                    chunks.append(record)
            if chunks:
                records.append(sequential_cost(chunks))
        return SutOutput({n: inputs[n] for n in OUTPUTS}, records)
    return run


def work(config, case, inputs):
    """One rank's launch of every token, as a card runs it (the estimate is the slowest
    rank's; a5sim's interpreter chunks re-read the weights, which shows as a higher ratio at
    the tensor level): ``x``, rope rows, the replicated weights and its ``wq_b`` rows with
    their scales read, its ``q`` and the ``kv``/``qr`` rows written, the four scratch
    outputs written and read back; cube BF16 FLOPs of the three products (the MX products
    run as BF16 here); vector: about 24 operations per decoded weight element (each decoded
    once) and 40 per quantized activation element."""
    t, tp = case.tokens, case.tp
    d, ql, hd = config.hidden_size, config.q_lora_rank, config.head_dim
    qw = local_heads(config, tp) * hd
    moved = tensor_bytes(*(inputs[n] for n in ("x", "rope_cos", "rope_sin", "wq_a",
                                               "wq_a_scale", "q_norm", "wkv", "wkv_scale",
                                               "kv_norm")))
    moved += tensor_bytes(inputs["wq_b"], inputs["wq_b_scale"]) // tp + 2 * t * (qw + hd + ql)
    moved += 2 * 2 * t * (d + 2 * ql + hd)  # scratch xq, qa, kva, qrq: written, read back
    flops = 2 * t * (d * ql + d * hd + ql * qw)
    vector = 24 * (ql * d + hd * d + qw * ql) + 40 * t * (d + ql)
    return Work(moved, {CUBE_BF16: flops, VECTOR_FP32: vector})


def golden(config, case, inputs):
    w, tp = _weights(inputs), case.tp
    res = [qkv_proj_rope(inputs["x"], w, inputs["rope_cos"], inputs["rope_sin"], config, tp=tp,
                         tp_rank=r) for r in range(tp)]
    return {"q": torch.stack([q for q, _, _ in res]), "kv": torch.stack([kv for _, kv, _ in res]),
            "qr": torch.stack([qr for _, _, qr in res])}


def compare(config, case, inputs, gold, actual):
    verdicts = []
    for r in range(case.tp):
        for name in OUTPUTS:
            a, g = actual[name][r], gold[name][r]
            if name == "q":  # one row per (token, head)
                a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
            label = f"{name}[{r}]"
            verdicts += check_row_bound(label, a, g) + check_sentinel(label, a, SENTINEL, ref=g)
    for name in ("kv", "qr"):  # TP replicas: byte-identical on every rank
        for r in range(1, case.tp):
            verdicts += check_non_owned_bytes(f"{name}[{r}] vs rank 0", actual[name][r],
                                              actual[name][0])
    return verdicts


ENTRY = register(Entry(
    name="qkv_proj_rope",
    description="Q-A (MXFP8 wq_a), q RMSNorm, Q-B (one rank's MXFP8 wq_b heads), KV (MXFP8 "
                "wkv), kv RMSNorm, RoPE on the tails from prepared rope rows; weights decoded "
                "in-kernel",
    support=SUPPORT,
    matrix=(Case(entry="qkv_proj_rope", tokens=21), Case(entry="qkv_proj_rope", tokens=40, tp=2),
            Case(entry="qkv_proj_rope", tokens=9, tp=4, seed=5)),
    slow_cases=(Case(entry="qkv_proj_rope", tokens=192, tp=4, preset="flash"),
                Case(entry="qkv_proj_rope", tokens=1024, tp=4, preset="flash", seed=3)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut(chunk=1 << 30)},
    work=work,
))
