"""mHC head kernel: the final collapse after the last layer (golden: ``goldens.mhc.hc_head``).

``y = sum_h last_pre_mix[:, h] * x_hc[:, h]`` -> BF16 ``[T, D]``: :mod:`v41.hc_pre`'s
collapse (FP32 accumulation in ascending lane order, one BF16 cast) with the last FFN site's
delayed pre-mix; there are no learned head parameters.  The final RMSNorm follows in a
separate kernel.

ABI
---
=============  ======================  ========  =====
name           shape                   dtype     role
=============  ======================  ========  =====
x_hc           (tokens, hc, hidden)    float32   in
last_pre_mix   (tokens, hc)            float32   in
y              (tokens, hidden)        bfloat16  out
=============  ======================  ========  =====
"""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from v41.abi import Arg, resolve
from v41.hc_pre import VARIANTS, build_collapse, dims

__all__ = ["ABI", "VARIANTS", "abi", "build", "dims"]

ABI = (
    Arg("x_hc", ("tokens", "hc", "hidden"), "float32", "in"),
    Arg("last_pre_mix", ("tokens", "hc"), "float32", "in"),
    Arg("y", ("tokens", "hidden"), "bfloat16", "out"),
)


def abi(config, case: dict):
    return resolve(ABI, dims(config, case))


def build(config, case: dict | None = None, *, variant: str = "reference",
          runtime_options: dict | None = None):
    """The jit kernel ``hc_head(x_hc, last_pre_mix, y)``; tokens are a dynamic axis."""
    return build_collapse(config, name="hc_head", variant=variant,
                          runtime_options=runtime_options)
