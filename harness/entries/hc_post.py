"""``hc_post``: v41.hc_post (mHC expand) against goldens.mhc.hc_post, per-row bound.

Every output row is one (token, lane) row of ``out [T, hc, D]`` (FP32 storage holding BF16
values).  ``comb`` is a Sinkhorn-projected lane-mixing matrix (goldens.mhc.sinkhorn of
random logits), deliberately far from symmetric so a transposed read is caught.
"""

from __future__ import annotations

import torch

from goldens.mhc import hc_post, sinkhorn
from harness.case import Case, Support
from harness.compare import check_non_owned_bytes, check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.entries.hc_pre import residual_lanes
from harness.fixtures import STREAM_SENTINEL, randn, sentinel, uniform
from harness.platforms.topology import VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

SUPPORT = Support(phase="prefill")


def build_inputs(config, case):
    hc, d, t = config.hc.hc_mult, config.hidden_size, case.tokens
    y_scale = uniform((t, 1), case.seed, "y_scale", -4, 4).exp2()
    logits = randn((t, hc, hc), case.seed, "comb_logits", scale=3.0)
    return {"y": (randn((t, d), case.seed, "y") * y_scale).to(torch.bfloat16),
            "x_hc": residual_lanes(config, case),
            "post": 2.0 * torch.sigmoid(randn((t, hc), case.seed, "post", scale=2.0)),
            "comb": sinkhorn(logits, config),
            "out": sentinel((t, hc, d), torch.float32, STREAM_SENTINEL)}


def work(config, case, inputs):
    """y, x_hc, post, comb read once, out written; per out element one FP32 multiply
    (post * y) and hc multiply-adds (comb mixing)."""
    per_element = 1 + 2 * config.hc.hc_mult
    return Work(tensor_bytes(*inputs.values()), {VECTOR_FP32: inputs["out"].numel() * per_element})


def golden(config, case, inputs):
    return {"out": hc_post(inputs["y"], inputs["x_hc"], inputs["post"], inputs["comb"], config)}


def compare(config, case, inputs, gold, actual):
    out = actual["out"]
    # storage format: every FP32 value must be a BF16 value (exact bytes after a round trip)
    as_bf16 = out.to(torch.bfloat16).to(torch.float32) if out.dtype == torch.float32 else out
    return (check_row_bound("out", out, gold["out"])
            + check_sentinel("out", out, STREAM_SENTINEL, ref=gold["out"])
            + check_non_owned_bytes("out:bf16_values", out, as_bf16))


ENTRY = register(Entry(
    name="hc_post",
    description="mHC expand post*y + sum_i comb[i, o]*x_i (FP32, post first, lanes "
                "ascending, BF16 rounding, FP32 storage)",
    support=SUPPORT,
    matrix=(Case(entry="hc_post", tokens=1), Case(entry="hc_post", tokens=19),
            Case(entry="hc_post", tokens=7, preset="flash")),
    slow_cases=(Case(entry="hc_post", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.hc_post"), "a5": single_launch("v41.hc_post")},
    work=work,
))
