"""``hierarchical_sparse_indexer``: v41.hierarchical_indexer (candidate blocks of the
candidate source's Full layer) against ``goldens.indexer.select_candidate_blocks``.

Fixture (deterministic in the seed): FP32 score rows holding BF16 values (the indexer's
scores) at the positions below each token's causal ``compressed_lens`` and ``-inf`` past
it; one token sees nothing (no pin, nothing kept), one token's length ends inside a block
(a partial newest block).  The width is twice ``candidate_topk_blocks x
candidate_block_size`` (TINY 32 positions; FLASH 32,768 positions = 4,096 blocks of 8, of
which 2,048 are kept), so the block limit binds.  Kind ``ties``: scores take only a few
values, so block scores tie and the tie rule (lower block wins) decides.

Launches: on a5sim's interpreter tokens are split on the host into chunks of
:data:`LAUNCH_ROWS` (its memory); elsewhere, and on an estimate-only platform (which
interprets nothing), all tokens go in one launch, as a card runs them.

Comparison: the mask exactly, byte for byte (the input scores are shared, so the selection
is determined; any difference is a defect).
"""

from __future__ import annotations

import torch

from goldens.indexer import select_candidate_blocks
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes
from harness.fixtures import generator, randn
from harness.platforms.topology import VECTOR_FP32
from harness.entries._kernel import launch_step, sequential_cost
from harness.registry import Entry, SutOutput, Work, register, tensor_bytes

MODULE = "v41.hierarchical_indexer"
SUPPORT = Support(phase="prefill", tp_sizes=(1, 4), kinds=("mixed", "ties"))
MASK_SENTINEL = 7  # unwritten mask bytes
LAUNCH_ROWS = 64  # a5sim: tokens per launch at most


def width_for(config) -> int:
    ix = config.index
    return 2 * ix.candidate_topk_blocks * ix.candidate_block_size


def build_inputs(config, case):
    t, seed, width = case.tokens, case.seed, width_for(config)
    cbs = config.index.candidate_block_size
    s = randn((t, width), seed, "scores")
    if case.kind == "ties":
        s = s.round().clamp(-2, 2)
    s = s.to(torch.bfloat16).to(torch.float32)
    lens = torch.randint(1, width + 1, (t,), generator=generator(seed, "lens"))
    lens[0] = 0
    if t > 1:
        lens[1] = width // 2 + cbs // 2 + 1  # ends inside a block
    s[torch.arange(width)[None, :] >= lens[:, None]] = float("-inf")
    return {"scores": s, "compressed_lens": lens.to(torch.int32),
            "candidate_mask": torch.full((t, width), MASK_SENTINEL, dtype=torch.uint8)}


def validate_launch(config, inputs) -> None:
    """Host checks before any launch: FP32 ``scores [T, width]`` with ``width`` a multiple
    of ``candidate_block_size`` and 8, no NaN or +inf; ``compressed_lens [T]`` in ``[0,
    width]``.  Raises ValueError naming the field and the bound."""
    s, lens = inputs["scores"], inputs["compressed_lens"]
    cbs = config.index.candidate_block_size
    if s.dtype != torch.float32 or s.dim() != 2:
        raise ValueError(f"scores: expected FP32 [T, width], got {s.dtype} {tuple(s.shape)}")
    t, width = s.shape
    if width % cbs or width % 8:
        raise ValueError(f"scores: width {width} must be a multiple of candidate_block_size "
                         f"{cbs} and of 8")
    bad = (torch.isnan(s) | (s == float("inf"))).nonzero()
    if bad.numel():
        i, k = (int(v) for v in bad[0])
        raise ValueError(f"scores[{i}, {k}]: {float(s[i, k])} (NaN and +inf are not scores)")
    if lens.dtype != torch.int32 or tuple(lens.shape) != (t,):
        raise ValueError(f"compressed_lens: expected INT32 [{t}], got {lens.dtype} "
                         f"{tuple(lens.shape)}")
    bad = ((lens < 0) | (lens > width)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"compressed_lens[{i}]: {int(lens[i])} outside [0, width={width}]")


def kernel_sut(variant: str = "reference"):
    """The SUT: host validation, then one launch per :data:`LAUNCH_ROWS` tokens on the
    interpreter, one launch for all tokens elsewhere (:func:`launch_step`)."""
    def run(platform, config, case, inputs) -> SutOutput:
        from harness.platforms import KernelSpec
        validate_launch(config, inputs)
        t, width = inputs["scores"].shape
        step = launch_step(platform, t, LAUNCH_ROWS)
        options = {} if variant == "reference" else {"variant": variant}
        out, records = inputs["candidate_mask"], []
        for t0 in range(0, t, step):
            n = min(step, t - t0)
            program = platform.compile(KernelSpec(MODULE, options), config,
                                       {"tokens": n, "width": width, "preset": case.preset})
            part = {a.name: inputs[a.name][t0:t0 + n].clone() for a in program.args}
            result = platform.launch(program, 0, part)
            result.raise_for_error()
            out[t0:t0 + n] = result.outputs["candidate_mask"]
            record = result.cost_record()
            if record:
                records.append(record)
        # chunks run one after another on one rank: their times add
        return SutOutput({"candidate_mask": out}, [sequential_cost(records)] if records else [])
    return run


def work(config, case, inputs):
    """Scores and lengths read once, the mask written once; per position about ``cbs + 2``
    vector operations (the max gathers, the -inf map, the mask expansion) and per block
    about 12 (pin, two selections, compaction)."""
    t, width = inputs["scores"].shape
    cbs = config.index.candidate_block_size
    return Work(tensor_bytes(*inputs.values()),
                {VECTOR_FP32: t * width * (cbs + 2) + 12 * t * (width // cbs)})


def golden(config, case, inputs):
    mask = select_candidate_blocks(config, inputs["scores"], inputs["compressed_lens"])
    return {"candidate_mask": mask.to(torch.uint8)}


def compare(config, case, inputs, gold, actual):
    return check_non_owned_bytes("candidate_mask", actual["candidate_mask"], gold["candidate_mask"])


ENTRY = register(Entry(
    name="hierarchical_sparse_indexer",
    description="candidate blocks at the candidate source: block max over 8 positions, newest "
                "partial block pinned, top candidate_topk_blocks (lower block wins ties), "
                "-inf blocks dropped, expanded to a position mask",
    support=SUPPORT,
    matrix=(Case(entry="hierarchical_sparse_indexer", tokens=9),
            Case(entry="hierarchical_sparse_indexer", tokens=6, kind="ties", seed=5),
            Case(entry="hierarchical_sparse_indexer", tokens=3, preset="flash")),
    slow_cases=(Case(entry="hierarchical_sparse_indexer", tokens=192, tp=4, preset="flash"),
                Case(entry="hierarchical_sparse_indexer", tokens=512, preset="flash", seed=3)),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
