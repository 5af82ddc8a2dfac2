"""``rope_rows``: v41.rope_rows against goldens.rope.materialize_rope_rows.

``case.tokens`` is the row-buffer length T, ``case.active`` the runtime ``num_tokens``
(rows at or past it are padding and must keep the caller's sentinel bytes).  Positions mix
valid table rows (including 0 and capacity - 1) with negatives (identity rotation);
padding rows hold positions far past the table, which neither the host check nor the
kernel may look at.  The host validates ``num_tokens`` and the active positions before
launch: a position at or past capacity is a ValueError naming ``position_ids[t]``.
"""

from __future__ import annotations

import torch

from goldens.rope import materialize_rope_rows, precompute_rope_tables
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel
from harness.entries._kernel import active_count, single_launch
from harness.fixtures import SENTINEL, generator
from harness.registry import Entry, Work, register, tensor_bytes

MODULE = "v41.rope_rows"
SUPPORT = Support(phase="prefill", inactive_rows=True)
OUTPUTS = ("rope_cos", "rope_sin")


def build_inputs(config, case):
    from v41.rope_rows import default_capacity  # no pypto: safe in the calling process

    capacity = default_capacity(config)
    half = config.rope.rope_dim // 2
    t, n = case.tokens, case.active
    cos, sin = precompute_rope_tables(config, compressed=case.seed % 2 == 1, capacity=capacity)
    pos = torch.randint(0, capacity, (t,), generator=generator(case.seed, "positions"),
                        dtype=torch.int32)
    pos[::5] = -1  # identity rows
    pos[3::7] = -7
    if n > 1:
        pos[1] = capacity - 1  # last table row
    if n > 2:
        pos[2] = 0
    pos[n:] = capacity + 1000  # padding: never validated, never read
    return {"freqs_cos": cos, "freqs_sin": sin, "position_ids": pos,
            "num_tokens": torch.tensor([n], dtype=torch.int32),
            "rope_cos": torch.full((t, half), SENTINEL, dtype=torch.float32),
            "rope_sin": torch.full((t, half), SENTINEL, dtype=torch.float32)}


def validate_launch(inputs) -> int:
    """Host check before launch: ``num_tokens`` in [0, T] and every active position below
    the table capacity.  Returns num_tokens; raises ValueError naming the field."""
    pos = inputs["position_ids"]
    n = active_count(inputs["num_tokens"], pos.shape[0])
    capacity = inputs["freqs_cos"].shape[0]
    too_far = (pos[:n].long() >= capacity).nonzero()
    if too_far.numel():
        i = int(too_far[0, 0])
        raise ValueError(f"position_ids[{i}]: {int(pos[i])} is at or past table capacity {capacity}")
    return n


def kernel_sut(**options):
    """The a5sim/a5 system under test: validate on the host, then one launch."""
    return single_launch(MODULE, validate=validate_launch, **options)


def work(config, case, inputs):
    """Active rows only: num_tokens and the n active positions read; per active token with
    a position >= 0 one cos and one sin table row gathered (a negative position is the
    identity and reads nothing); n rows of each output written.  No arithmetic."""
    n = int(inputs["num_tokens"][0])
    pos = inputs["position_ids"][:n]
    gathered = int((pos >= 0).sum())
    table_row = tensor_bytes(inputs["freqs_cos"][0]) + tensor_bytes(inputs["freqs_sin"][0])
    out_row = tensor_bytes(inputs["rope_cos"][0]) + tensor_bytes(inputs["rope_sin"][0])
    return Work(tensor_bytes(inputs["num_tokens"], pos) + gathered * table_row + n * out_row)


def golden(config, case, inputs):
    cos, sin = inputs["rope_cos"].clone(), inputs["rope_sin"].clone()
    materialize_rope_rows(inputs["freqs_cos"], inputs["freqs_sin"], inputs["position_ids"],
                          int(inputs["num_tokens"][0]), cos, sin)
    return {"rope_cos": cos, "rope_sin": sin}


def compare(config, case, inputs, gold, actual):
    n = int(inputs["num_tokens"][0])
    written = slice(0, n)
    verdicts = []
    for name in OUTPUTS:
        if n:  # (summarize cannot take an empty per-row torch bound)
            verdicts += check_row_bound(name, actual[name], gold[name], rows=written)
            verdicts += check_sentinel(name, actual[name], SENTINEL, rows=written, ref=gold[name])
        # rows >= num_tokens: the caller's bytes, untouched
        verdicts += check_non_owned_bytes(name, actual[name], inputs[name], owned=written)
    return verdicts


ENTRY = register(Entry(
    name="rope_rows",
    description="RoPE table rows for the active tokens (negative position = identity); "
                "num_tokens is an INT32 [1] tensor",
    support=SUPPORT,
    matrix=(Case(entry="rope_rows", tokens=40, active_tokens=37),
            Case(entry="rope_rows", tokens=5, seed=4),
            Case(entry="rope_rows", tokens=192, active_tokens=150, preset="flash")),
    slow_cases=(Case(entry="rope_rows", tokens=4096, active_tokens=4000, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": kernel_sut(), "a5": kernel_sut()},
    work=work,
))
