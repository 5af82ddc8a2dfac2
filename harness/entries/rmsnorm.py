"""``rmsnorm``: v41.rmsnorm against goldens.norm.rms_norm, per-row contract bound."""

from __future__ import annotations

import torch

from goldens.norm import rms_norm
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.fixtures import SENTINEL, randn, sentinel, uniform
from harness.platforms.topology import VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

SUPPORT = Support(phase="prefill", kinds=("mixed", "zero"))


def build_inputs(config, case):
    d = config.hidden_size
    # rows of very different magnitude; "zero" makes every third row all-zero (eps path)
    scale = uniform((case.tokens, 1), case.seed, "row_scale", -6, 6).exp2()
    x = randn((case.tokens, d), case.seed, "x") * scale
    if case.kind == "zero":
        x[::3] = 0
    return {"x": x.to(torch.bfloat16),
            "weight": uniform((d,), case.seed, "weight", 0.5, 1.5, torch.bfloat16),
            "y": sentinel((case.tokens, d))}


def work(config, case, inputs):
    """x and weight read once, y written; FP32 vector math per element: square, sum,
    scale, weight."""
    return Work(tensor_bytes(*inputs.values()), {VECTOR_FP32: 4 * inputs["x"].numel()})


def golden(config, case, inputs):
    return {"y": rms_norm(inputs["x"], inputs["weight"], config.rms_norm_eps)}


def compare(config, case, inputs, gold, actual):
    return (check_row_bound("y", actual["y"], gold["y"])
            + check_sentinel("y", actual["y"], SENTINEL, ref=gold["y"]))


ENTRY = register(Entry(
    name="rmsnorm",
    description="RMSNorm (FP32 math, one BF16 cast); tokens on a dynamic axis",
    support=SUPPORT,
    matrix=(Case(entry="rmsnorm", tokens=1), Case(entry="rmsnorm", tokens=33, kind="zero"),
            Case(entry="rmsnorm", tokens=7, preset="flash")),
    slow_cases=(Case(entry="rmsnorm", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.rmsnorm"), "a5": single_launch("v41.rmsnorm")},
    work=work,
))
