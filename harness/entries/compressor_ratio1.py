"""``compressor_ratio1``: v41.compressor_ratio1 (C1A Full latent, MXFP4 compressed KV and
index-key publication) against ``goldens.compressor.compress_and_publish`` at ratio 1.

Fixture and comparison: :mod:`harness.entries.compressor_fixture` (paged slots through a
nonidentity block table, inert negative-position rows with junk slots, unpublished valid
tokens, padding rows with junk x / positions / slots, caches of random bytes).  Published
rows are compared dequantized (MXFP4 relative L2 <= 4 %) and the four caches must be
byte-identical to the input everywhere else.

Host validation (:func:`validate_launch`, before any compile or launch): the kernel's ABI
dtypes (INT32 metadata, uint8 caches, ``num_tokens`` INT32 ``[1]``), then the golden's own
argument checks (``goldens.compressor``: shapes, query starts, request ownership,
consecutive positions, slot range and duplicates, RoPE capacity), each naming the field
and the bound.

Launches: ratio 1 is stateless, so on a5sim's interpreter the SUT publishes in host chunks
of :data:`A5SIM_CHUNK` tokens (its memory; each launch continues the previous caches; the
metadata is sliced, ``num_tokens`` clipped to the chunk), and the cost record sums the
chunks; an estimate-only platform takes all tokens in one launch, as a card runs it
(``_kernel.launch_step``): FLASH T=2048 (2000 active) 508.8 -> 329.0 us (eight summed
launches of 256 tokens -> one of 1,252 tasks).
"""

from __future__ import annotations

import dataclasses

import torch

from goldens.compressor import _validate as golden_validate
from harness.case import Case, Support
from harness.entries import compressor_fixture as fx
from harness.platforms.topology import VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.compressor_ratio1"
RATIO = 1
SUPPORT = Support(phase="prefill", inactive_rows=True)
A5SIM_CHUNK = 256  # tokens per a5sim launch
ROW_INPUTS = ("x", "position_ids", "compressed_slots")
WEIGHTS = ("wkv", "norm", "index_wk", "index_norm", "freqs_cos", "freqs_sin")
VECTOR_OPS_PER_ELEMENT = 40  # nominal: RMSNorms, RoPE, MXFP4 scale and E2M1 encoding


def build_inputs(config, case):
    return fx.build_inputs(config, case, RATIO)


# ---- host validation -------------------------------------------------------------------------

def _require(name: str, t, dtype: torch.dtype, shape=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype}, the kernel takes {dtype}")
    if shape is not None and list(t.shape) != list(shape):
        raise ValueError(f"{name}: shape {list(t.shape)}, the kernel takes {list(shape)}")


def validate_launch(config, inputs, ratio: int = RATIO, state_cache=None) -> int:
    """Host checks before any launch; returns the number of published rows.  Raises
    ValueError naming the field and the bound (kernel ABI dtypes first, then the golden's
    argument checks)."""
    for name in ("position_ids", "compressed_slots", "token_to_req_indices",
                 "query_start_loc"):
        _require(name, inputs.get(name), torch.int32)
    _require("num_tokens", inputs.get("num_tokens"), torch.int32, [1])
    for name in fx.CACHES:
        _require(name, inputs.get(name), torch.uint8)
    plan = golden_validate(config, ratio, inputs["x"], fx.golden_weights(inputs),
                           inputs["query_start_loc"], inputs["position_ids"],
                           inputs["token_to_req_indices"], int(inputs["num_tokens"][0]),
                           inputs["compressed_slots"], inputs["freqs_cos"], inputs["freqs_sin"],
                           fx.source_caches(inputs), inputs.get("state_block_table"),
                           state_cache)
    return len(plan.publish)


# ---- system under test -----------------------------------------------------------------------

def kernel_sut(chunk: int | None = None, **options):
    """Validate on the host, then launch ``chunk`` tokens at a time (all at once when
    None), each launch continuing from the previous caches; the cost record sums them."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, inputs)
        spec = KernelSpec(MODULE, options)
        t = inputs["x"].shape[0]
        n = int(inputs["num_tokens"][0])
        step = launch_step(platform, t, chunk) if chunk else t
        out = {k: inputs[k] for k in fx.CACHES}
        extra = {"blocks": out["compressed_kv"].shape[0],
                 "capacity": inputs["freqs_cos"].shape[0]}
        records = []
        for c0 in range(0, t, step):
            c1 = min(t, c0 + step)
            if c0 > 0 and c0 >= n:
                break  # only padding left: nothing to read or write
            axes = {**dataclasses.asdict(case), "tokens": c1 - c0, **extra}
            program = platform.compile(spec, config, axes)
            args = {**{k: inputs[k] for k in WEIGHTS},
                    **{k: inputs[k][c0:c1].contiguous() for k in ROW_INPUTS},
                    "num_tokens": torch.tensor([max(0, min(n, c1) - c0)], dtype=torch.int32),
                    **out}
            result = platform.launch(program, 0, {a.name: args[a.name] for a in program.args})
            result.raise_for_error()
            out = {k: result.outputs[k] for k in fx.CACHES}
            if record := result.cost_record():
                records.append(record)
        return SutOutput(out, [sequential_cost(records)] if records else [])
    return run


# ---- golden and comparison -------------------------------------------------------------------

def golden(config, case, inputs):
    out = {k: inputs[k].clone() for k in fx.CACHES}
    fx.run_golden(config, RATIO, inputs, out)
    return out


def compare(config, case, inputs, gold, actual):
    return fx.compare_caches(config, inputs, gold, actual)


def work(config, case, inputs):
    """Valid x rows and weights read once, published rows' four cache rows written; BF16
    cube FLOPs of both projections, nominal vector work per latent element."""
    n = int(inputs["num_tokens"][0])
    pub = int(fx.published_slots(inputs).numel())
    h, d, di = config.hidden_size, config.head_dim, config.index.head_dim
    row = tensor_bytes(*(inputs[k][0, 0] for k in fx.CACHES))
    moved = (n * h * 2 + tensor_bytes(*(inputs[k] for k in ("wkv", "norm", "index_wk",
                                                             "index_norm")))
             + n * (8 + inputs["freqs_cos"].shape[1] * 8) + pub * row)
    return Work(moved, {"bf16": 2 * n * h * d + 2 * n * d * di,
                        VECTOR_FP32: VECTOR_OPS_PER_ELEMENT * n * (d + di)})


ENTRY = register(Entry(
    name="compressor_ratio1",
    description="ratio-1 compressor: RMSNorm(x @ wkv) latent, RoPE'd MXFP4 g16/E4M3 "
                "compressed KV and MXFP4 g32/E8M0 index key published at compressed slots",
    support=SUPPORT,
    matrix=(Case(entry="compressor_ratio1", tokens=40, active_tokens=33, requests=3),
            Case(entry="compressor_ratio1", tokens=5, seed=4),
            Case(entry="compressor_ratio1", tokens=8, active_tokens=0, seed=2)),
    # FLASH: the decode batch one TP4 rank runs (the compressor is not head-sharded, so a
    # rank's launch is the whole batch) and a prefill batch.
    slow_cases=(Case(entry="compressor_ratio1", tokens=192, active_tokens=180, requests=32,
                     preset="flash"),
                Case(entry="compressor_ratio1", tokens=2048, active_tokens=2000, requests=4,
                     preset="flash")),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(A5SIM_CHUNK), "a5": kernel_sut()},
    work=work,
))
