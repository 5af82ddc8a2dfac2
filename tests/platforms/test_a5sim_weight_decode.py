"""a5sim: the in-kernel weight decoders are exact.  Every packed byte value (MXFP4: all 256
nibble pairs; MXFP8: every E4M3 code but the two NaN codes) under a wide range of E8M0
scale codes, including codes >= 128 (which pypto's interpreter reads as negative int8),
decodes bit for bit to the golden dequantization cast to BF16: the FP4 expert planes
(:func:`v41.mx_fp4_decode.fp4_pair_tile`) and the FP8 linear tiles by both paths of
:func:`v41.mx_linear.mx_weight_tile_bf16`.  Scale codes are kept where every product is a
normal BF16 number (the ``exp``-built power of two is exact only up to its BF16 rounding)."""

from __future__ import annotations

import pytest
import torch

from goldens.quant import dequantize_fp4_expert_weight, dequantize_fp8_weight
from harness.case import Case
from harness.platforms import KernelSpec

CONFIG = Case(entry="rmsnorm", tokens=1).config  # the probes read no config field
SCALES = (100, 127, 128, 131, 150, 200)  # 2^-27 .. 2^73; 128+ read as signed by the interpreter


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def run(platform, builder: str, abi: str, case: dict, args: dict, **options):
    spec = KernelSpec("v41.decode_probe", options, builder=builder, abi=abi)
    program = platform.compile(spec, CONFIG, case)
    return platform.launch(program, 0, args).raise_for_error().outputs


def test_fp4_expert_planes_are_exact_for_every_byte(numerics):
    n, k = 128, 512  # 256 packed bytes a row: row r holds every byte value, rotated by r
    row = torch.arange(256, dtype=torch.int64)
    packed = torch.stack([(row + r) % 256 for r in range(n)]).to(torch.uint8)
    g = torch.Generator().manual_seed(4)
    scales = torch.tensor(SCALES, dtype=torch.uint8)[
        torch.randint(len(SCALES), (n, k // 32), generator=g)]
    out = run(numerics, "build_fp4", "abi_fp4", {"n": n, "k": k},
              {"packed": packed[None], "scales": scales[None],
               "lo": torch.zeros((n, k // 2), dtype=torch.bfloat16),
               "hi": torch.zeros((n, k // 2), dtype=torch.bfloat16)})
    gold = dequantize_fp4_expert_weight(packed, scales).to(torch.bfloat16)
    assert torch.equal(bits(out["lo"]), bits(gold[:, 0::2]))
    assert torch.equal(bits(out["hi"]), bits(gold[:, 1::2]))


@pytest.mark.parametrize("table", [True, False], ids=["whole_rows", "arithmetic"])
def test_fp8_linear_tiles_are_exact_for_every_code(numerics, table):
    n, k = 128, 256
    codes = torch.arange(n * k, dtype=torch.int64).reshape(n, k) % 256
    codes[(codes & 0x7F) == 0x7F] = 0  # E4M3 NaN codes are never published
    w = codes.to(torch.uint8)
    g = torch.Generator().manual_seed(5)
    ws = torch.tensor(SCALES, dtype=torch.uint8)[
        torch.randint(len(SCALES), (n // 32, k // 32), generator=g)]
    out = run(numerics, "build_fp8", "abi_fp8", {"n": n, "k": k},
              {"w": w, "ws": ws, "out": torch.zeros((n, k), dtype=torch.bfloat16)},
              table=table)
    gold = dequantize_fp8_weight(w.view(torch.float8_e4m3fn), ws).to(torch.bfloat16)
    assert torch.equal(bits(out["out"]), bits(gold))
