"""``hc_mixes``: v41.hc_mixes against goldens.mhc.hc_mixes (pre, post, comb), per-row bound.

Every output is FP32; each row (one token's ``pre`` or ``post``, one (token, in-lane) row
of ``comb``) is held to the contract bound.  The contract bound cannot see the Sinkhorn
pass count (20 vs 19 passes differ by <= 0.01 % on the default fixture): kind ``sharp``
scales the comb logits up so Sinkhorn converges slowly and adds a tighter
``comb:sinkhorn_passes`` row check (0.1 % RMS) that a pass more or less fails.  Parameters follow the released model's
scale: ``fn`` small (std 1/sqrt(hc_dim)), ``scale`` O(1) per group, ``base`` O(1).
"""

from __future__ import annotations

import torch

from goldens.mhc import HcSiteWeights, hc_mixes
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel
from harness.entries._kernel import single_launch
from harness.entries.hc_pre import residual_lanes
from harness.fixtures import SENTINEL, randn, sentinel, uniform
from harness.platforms.topology import CUBE_FP32, VECTOR_FP32
from harness.registry import Entry, Work, register, tensor_bytes

SUPPORT = Support(phase="prefill", kinds=("mixed", "sharp"))
SHARP_COMB_SCALE = 16.0  # kind "sharp": comb logits scaled up, Sinkhorn converges slowly
# Pass-count check on kind "sharp" (not a contract number): one Sinkhorn pass more or less
# moves the worst comb row by ~0.6 % relative RMS there, inside the contract's 1 %, while
# the a5sim kernel is within ~1e-5; 0.1 % separates the two with margin either side.
PASSES_RMS_RTOL = 1e-3
PASSES_PEAK_RTOL = 5e-3
OUTPUTS = ("pre", "post", "comb")


def build_inputs(config, case):
    hc, t = config.hc.hc_mult, case.tokens
    mix, hc_dim = config.mix_hc, config.hc_dim
    scale = uniform((3,), case.seed, "hc_scale", 0.5, 2.0)
    if case.kind == "sharp":
        scale[2] = SHARP_COMB_SCALE
    return {"x_hc": residual_lanes(config, case),
            "fn": randn((mix, hc_dim), case.seed, "hc_fn", scale=hc_dim ** -0.5),
            "scale": scale,
            "base": randn((mix,), case.seed, "hc_base"),
            "pre": sentinel((t, hc), torch.float32),
            "post": sentinel((t, hc), torch.float32),
            "comb": sentinel((t, hc, hc), torch.float32)}


def work(config, case, inputs):
    """Every tensor moved once; the FP32 x FP32 projection on the cube; on the vector unit
    the RMS (square, sum per lane element) and the Sinkhorn passes (a sum and a divide per
    comb element for rows and again for columns, per pass)."""
    t, hc = case.tokens, config.hc.hc_mult
    vector = 2 * inputs["x_hc"].numel() + config.hc.sinkhorn_iters * 4 * t * hc * hc
    return Work(tensor_bytes(*inputs.values()),
                {CUBE_FP32: 2 * t * config.hc_dim * config.mix_hc, VECTOR_FP32: vector})


def golden(config, case, inputs):
    mixes = hc_mixes(inputs["x_hc"],
                     HcSiteWeights(inputs["fn"], inputs["scale"], inputs["base"]), config)
    return {"pre": mixes.pre, "post": mixes.post, "comb": mixes.comb}


def compare(config, case, inputs, gold, actual):
    verdicts = []
    for name in OUTPUTS:
        verdicts += check_row_bound(name, actual[name], gold[name])
        verdicts += check_sentinel(name, actual[name], SENTINEL, ref=gold[name])
    if case.kind == "sharp":
        verdicts += check_row_bound("comb:sinkhorn_passes", actual["comb"], gold["comb"],
                                    rms_rtol=PASSES_RMS_RTOL, peak_rtol=PASSES_PEAK_RTOL)
    return verdicts


ENTRY = register(Entry(
    name="hc_mixes",
    description="mHC site coefficients: RMS-scaled FP32 projection, sigmoid pre/post, "
                "20-pass Sinkhorn comb",
    support=SUPPORT,
    matrix=(Case(entry="hc_mixes", tokens=1), Case(entry="hc_mixes", tokens=19, kind="sharp"),
            Case(entry="hc_mixes", tokens=7, preset="flash")),
    slow_cases=(Case(entry="hc_mixes", tokens=192, preset="flash"),),
    build_inputs=build_inputs, golden=golden, compare=compare,
    kernels={"a5sim": single_launch("v41.hc_mixes"), "a5": single_launch("v41.hc_mixes")},
    work=work,
))
