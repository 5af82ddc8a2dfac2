"""``hc_pre``: v41.hc_pre (mHC collapse) against goldens.mhc.hc_pre, per-row bound."""

from __future__ import annotations

import torch

from goldens.mhc import hc_pre
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.fixtures import SENTINEL, randn, sentinel, uniform
from harness.platforms.topology import VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

SUPPORT = Support(phase="prefill", kinds=("mixed", "onehot"))


def residual_lanes(config, case, tag: str = "x_hc") -> torch.Tensor:
    """FP32 ``[T, hc, D]`` residual lanes holding BF16 values, row scales over 2^-6..2^6."""
    hc, d = config.hc.hc_mult, config.hidden_size
    scale = uniform((case.tokens, hc, 1), case.seed, f"{tag}_scale", -6, 6).exp2()
    return (randn((case.tokens, hc, d), case.seed, tag) * scale).to(torch.bfloat16).float()


def pre_mix(config, case, tag: str = "pre") -> torch.Tensor:
    """FP32 ``[T, hc]`` pre-mix: ``sigmoid(.) + eps`` values; kind "onehot" puts the very
    first site's one-hot lane-0 mix on every third token."""
    hc = config.hc.hc_mult
    pre = torch.sigmoid(randn((case.tokens, hc), case.seed, tag, scale=2.0)) + config.hc.eps
    if case.kind == "onehot":
        pre[::3] = 0.0
        pre[::3, 0] = 1.0
    return pre


def build_inputs(config, case):
    return {"x_hc": residual_lanes(config, case), "pre": pre_mix(config, case),
            "y": sentinel((case.tokens, config.hidden_size))}


def work(config, case, inputs):
    """x_hc and pre read once, y written; one FP32 multiply and add per lane element."""
    return Work(tensor_bytes(*inputs.values()), {VECTOR_FP32: 2 * inputs["x_hc"].numel()})


def golden(config, case, inputs):
    return {"y": hc_pre(inputs["x_hc"], inputs["pre"], config)}


def compare(config, case, inputs, gold, actual):
    return (check_row_bound("y", actual["y"], gold["y"])
            + check_sentinel("y", actual["y"], SENTINEL, ref=gold["y"]))


ENTRY = register(Entry(
    name="hc_pre",
    description="mHC collapse sum_h pre[:, h] * x_hc[:, h] (FP32, ascending lanes, one BF16 cast)",
    support=SUPPORT,
    matrix=(Case(entry="hc_pre", tokens=1), Case(entry="hc_pre", tokens=19, kind="onehot"),
            Case(entry="hc_pre", tokens=7, preset="flash")),
    slow_cases=(Case(entry="hc_pre", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.hc_pre"), "a5": single_launch("v41.hc_pre")},
    work=work,
))
