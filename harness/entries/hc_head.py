"""``hc_head``: v41.hc_head (final mHC collapse) against goldens.mhc.hc_head, per-row bound.

The delayed pre-mix is a site's ``pre`` (``sigmoid(.) + hc_eps``, not normalized); kind
"onehot" also covers a model whose only site handed on the initial one-hot lane-0 mix.
"""

from __future__ import annotations

from goldens.mhc import hc_head
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.entries.hc_pre import pre_mix, residual_lanes
from harness.fixtures import SENTINEL, sentinel
from harness.platforms.topology import VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

SUPPORT = Support(phase="prefill", kinds=("mixed", "onehot"))


def build_inputs(config, case):
    return {"x_hc": residual_lanes(config, case, "x_hc_last"),
            "last_pre_mix": pre_mix(config, case, "last_pre_mix"),
            "y": sentinel((case.tokens, config.hidden_size))}


def work(config, case, inputs):
    """x_hc and last_pre_mix read once, y written; one FP32 multiply and add per lane
    element."""
    return Work(tensor_bytes(*inputs.values()), {VECTOR_FP32: 2 * inputs["x_hc"].numel()})


def golden(config, case, inputs):
    return {"y": hc_head(inputs["x_hc"], inputs["last_pre_mix"], config)}


def compare(config, case, inputs, gold, actual):
    return (check_row_bound("y", actual["y"], gold["y"])
            + check_sentinel("y", actual["y"], SENTINEL, ref=gold["y"]))


ENTRY = register(Entry(
    name="hc_head",
    description="final mHC collapse with the last delayed pre-mix (FP32, one BF16 cast)",
    support=SUPPORT,
    matrix=(Case(entry="hc_head", tokens=9, kind="onehot"),
            Case(entry="hc_head", tokens=5, preset="flash")),
    slow_cases=(Case(entry="hc_head", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.hc_head"), "a5": single_launch("v41.hc_head")},
    work=work,
))
