"""``compressor_ratio2``: v41.compressor_ratio2 (C2A Full paired pooling over the FP32 state
ring, MXFP4 compressed KV and index-key publication) against
``goldens.compressor.compress_and_publish`` at ratio 2.

Fixture: :mod:`harness.entries.compressor_fixture` at ratio 2 (paged slots on odd
positions, a disabled request holding inert rows, chunks longer than the 4-row ring,
chunks that start at an odd position and read their predecessor from the ring, padding
rows with junk slots, caches of random bytes, a ring of FP32 normals).

Comparison: the four caches as for ratio 1 (published rows dequantized, MXFP4 relative L2
<= 4 %; every other byte identical) and the state ring slot by slot
(``check_state_ring``): the written slots within ``|a - r| <= RING_ATOL + RING_RTOL |r|``
-- the kernel's FP32 cube accumulation differs from the golden's correctly rounded FP32
projection by reassociation only -- and every other ring byte identical.

Launches: on a5sim the SUT runs :data:`A5SIM_CHUNK` packed rows per launch
(:func:`chunk_inputs`; the ring carries a split request's state from one launch to the
next, as the contract's chunked == unchunked rule requires); on cards one launch.

Host validation (:func:`validate_launch`): the ratio-1 entry's checks (kernel dtypes, the
golden's argument checks, which include the state table and ring) plus this kernel's
restriction that positions inside an enabled request's chunk are nonnegative.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.case import Case, Support
from harness.compare import check_state_ring
from harness.entries import compressor_fixture as fx
from harness.entries import compressor_ratio1 as ratio1
from harness.platforms.topology import VECTOR_FP32
from harness.entries._kernel import sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.compressor_ratio2"
RATIO = 2
SUPPORT = Support(phase="prefill", inactive_rows=True)
A5SIM_CHUNK = 256  # packed rows per a5sim launch (interpreter memory)
RING_ATOL = 1e-5  # FP32 projections of O(1) values: reassociation only (measured ~1e-6)
RING_RTOL = 1e-5
OUTPUTS = (*fx.CACHES, "state_cache")
VECTOR_OPS_PER_ELEMENT = 50  # nominal: pooling softmax, RMSNorms, RoPE, MXFP4 encoding


def build_inputs(config, case):
    return fx.build_inputs(config, case, RATIO)


def validate_launch(config, inputs) -> int:
    """Host checks before any launch; returns the number of published rows.  Raises
    ValueError naming the field and the bound."""
    ratio1._require("state_block_table", inputs.get("state_block_table"), torch.int32)
    ratio1._require("state_cache", inputs.get("state_cache"), torch.float32)
    published = ratio1.validate_launch(config, inputs, RATIO, inputs["state_cache"])
    qsl = inputs["query_start_loc"].tolist()
    pos = inputs["position_ids"]
    for r, blk in enumerate(inputs["state_block_table"][:, 0].tolist()):
        if blk < 0 or qsl[r] == qsl[r + 1]:
            continue
        neg = (pos[qsl[r]:qsl[r + 1]] < 0).nonzero().flatten()
        if neg.numel():
            t = qsl[r] + int(neg[0])
            raise ValueError(f"position_ids[{t}]: {int(pos[t])} inside enabled request {r}'s "
                             f"chunk; the ratio-2 kernel takes positions >= 0 there (contract: "
                             f"nonnegative, consecutive)")
    return published


def ring_slots(config, inputs) -> torch.Tensor:
    """Flat ring rows ``block * capacity + p % capacity`` the call writes: the last
    ``min(chunk, capacity)`` rows of every enabled, nonempty request chunk."""
    cap = config.cache.state_capacity
    qsl = inputs["query_start_loc"].tolist()
    pos = inputs["position_ids"].tolist()
    out = []
    for r, blk in enumerate(inputs["state_block_table"][:, 0].tolist()):
        if blk < 0:
            continue
        rows = [t for t in range(qsl[r], qsl[r + 1]) if pos[t] >= 0]
        out += [blk * cap + pos[t] % cap for t in rows[-min(len(rows), cap):]] if rows else []
    return torch.tensor(out, dtype=torch.long)


# ---- system under test -----------------------------------------------------------------------

def chunk_inputs(inputs: dict, c0: int, c1: int) -> dict:
    """The packed rows ``[c0, c1)`` as a call of their own: every request keeps its batch row
    and state block, its chunk clipped to the window (a request split across windows is
    two consecutive chunks, which the ring semantics make equal to one)."""
    n = int(inputs["num_tokens"][0])
    out = dict(inputs)
    for k in ("x", "position_ids", "compressed_slots", "token_to_req_indices"):
        out[k] = inputs[k][c0:c1].contiguous()
    qsl = inputs["query_start_loc"].clamp(c0, max(c0, min(c1, n))) - c0
    out["query_start_loc"] = qsl.to(torch.int32)
    out["num_tokens"] = torch.tensor([max(0, min(n, c1) - c0)], dtype=torch.int32)
    return out


def kernel_sut(chunk: int | None = None, **options):
    """Validate on the host, then launch ``chunk`` packed rows at a time (all at once when
    None; see :func:`chunk_inputs`), each launch continuing the previous caches and ring;
    the cost record sums the launches."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, inputs)
        t = inputs["x"].shape[0]
        n = int(inputs["num_tokens"][0])
        step = chunk or t
        state = {k: inputs[k] for k in OUTPUTS}
        records = []
        for c0 in range(0, t, step):
            if c0 > 0 and c0 >= n:
                break  # only padding left
            call = {**chunk_inputs(inputs, c0, min(t, c0 + step)), **state}
            rows = call["x"].shape[0]
            axes = {**dataclasses.asdict(case), "tokens": rows,
                    "blocks": call["compressed_kv"].shape[0],
                    "capacity": call["freqs_cos"].shape[0],
                    "requests": call["state_block_table"].shape[0],
                    "state_blocks": call["state_cache"].shape[0]}
            program = platform.compile(KernelSpec(MODULE, options), config, axes)
            call["workspace"] = torch.zeros(rows + axes["requests"], config.state_width)
            result = platform.launch(program, 0, {a.name: call[a.name] for a in program.args})
            result.raise_for_error()
            state = {k: result.outputs[k] for k in OUTPUTS}
            if record := result.cost_record():
                records.append(record)
        return SutOutput(state, [sequential_cost(records)] if records else [])
    return run


# ---- golden and comparison -------------------------------------------------------------------

def golden(config, case, inputs):
    out = {k: inputs[k].clone() for k in fx.CACHES}
    state = inputs["state_cache"].clone()
    fx.run_golden(config, RATIO, inputs, out, state)
    return {**out, "state_cache": state}


def compare(config, case, inputs, gold, actual):
    verdicts = fx.compare_caches(config, inputs, gold, actual)
    verdicts += check_state_ring("state_cache", actual["state_cache"], gold["state_cache"],
                                 ring_slots(config, inputs), atol=RING_ATOL, rtol=RING_RTOL)
    return verdicts


def work(config, case, inputs):
    """Valid x rows, both FP32 weights and the read ring rows in; published cache rows and
    written ring rows out; FP32 cube FLOPs of the two projections, BF16 of the index key."""
    n = int(inputs["num_tokens"][0])
    pub = int(fx.published_slots(inputs).numel())
    ring = int(ring_slots(config, inputs).numel())
    h, d, di, sw = config.hidden_size, config.head_dim, config.index.head_dim, config.state_width
    row = tensor_bytes(*(inputs[k][0, 0] for k in fx.CACHES))
    moved = (n * h * 2 + tensor_bytes(*(inputs[k] for k in ("wkv", "wgate", "norm", "index_wk",
                                                             "index_norm")))
             + n * (12 + inputs["freqs_cos"].shape[1] * 8) + pub * row
             + (inputs["state_block_table"].shape[0] + ring) * sw * 4)
    return Work(moved, {"fp32": 4 * n * h * d, "bf16": 2 * n * d * di,
                        VECTOR_FP32: VECTOR_OPS_PER_ELEMENT * n * (d + di)})


ENTRY = register(Entry(
    name="compressor_ratio2",
    description="ratio-2 compressor: paired softmax pooling over the FP32 state ring "
                "(reads before writes, last min(chunk, ring) rows written), MXFP4 "
                "compressed KV and index key published at compressed slots",
    support=SUPPORT,
    matrix=(Case(entry="compressor_ratio2", tokens=40, active_tokens=33, requests=3),
            Case(entry="compressor_ratio2", tokens=6, requests=2, seed=4),
            Case(entry="compressor_ratio2", tokens=8, active_tokens=0, seed=2)),
    slow_cases=(Case(entry="compressor_ratio2", tokens=192, active_tokens=180, requests=32,
                     preset="flash"),
                Case(entry="compressor_ratio2", tokens=512, active_tokens=500, requests=2,
                     preset="flash")),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(A5SIM_CHUNK), "a5": kernel_sut()},
    work=work,
))
