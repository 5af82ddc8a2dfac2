"""a5sim: the whole-row KV-cache decoders of :mod:`v41.kv_decode` gather the rows a token
names and decode them bit for bit to the golden dequantization cast to BF16, for every code:

* MXFP8 window rows (:func:`~v41.kv_decode.window_keys`): every E4M3 code but the two NaN
  codes, E8M0 scale codes on both sides of 128 (the interpreter reads 128+ as negative int8);
* MXFP4 compressed rows (:func:`~v41.kv_decode.fp4_keys`): every packed byte, E4M3 scale
  codes including subnormal and negative ones;
* MXFP4 index keys (the same decoder with E8M0 scales, 32-element groups).

A -1 id reads row 0 (the kernels mask that key).  The probe kernel is
``v41.decode_probe.build_kv``."""

from __future__ import annotations

import pytest
import torch

from goldens.quant import dequantize_compressed_kv, dequantize_index_key, dequantize_window_kv
from harness.case import Case
from harness.platforms import KernelSpec

CONFIG = Case(entry="rmsnorm", tokens=1).config  # the probe reads no config field
BLOCKS, BLOCK_SIZE, TOKENS, KEYS = 4, 16, 2, 64
E8M0 = (100, 127, 128, 131, 150)
E4M3 = (3, 40, 56, 70, 0xB8, 0xC6)  # subnormal, 0.25 .. 2, and two negative scales


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _codes(rows: int, width: int, skip_nan: bool) -> torch.Tensor:
    """uint8 ``[rows, width]``: every byte value, each row rotated."""
    codes = (torch.arange(rows * width, dtype=torch.int64).reshape(rows, width) * 7
             + torch.arange(rows)[:, None]) % 256
    if skip_nan:
        codes[(codes & 0x7F) == 0x7F] = 0  # E4M3 NaN codes are never published
    return codes.to(torch.uint8)


def _ids(rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, rows, (TOKENS, KEYS), generator=g)
    ids[0, :rows] = torch.arange(rows)[torch.randperm(rows, generator=g)][:KEYS]
    ids[1, ::5] = -1
    return ids.to(torch.int32)


def _run(numerics, case: dict, payload, scales, ids):
    spec = KernelSpec("v41.decode_probe", {}, builder="build_kv", abi="abi_kv")
    program = numerics.compile(spec, CONFIG, case)
    d = case["d"]
    out = torch.zeros(TOKENS, KEYS, d, dtype=torch.bfloat16)
    args = {"payload": payload, "scales": scales, "ids": ids, "out": out}
    return numerics.launch(program, 0, args).raise_for_error().outputs["out"]


@pytest.mark.parametrize("fmt", ["window", "compressed", "index_key"])
def test_kv_rows_decode_exactly_for_every_code(numerics, fmt):
    rows = BLOCKS * BLOCK_SIZE
    d, group = {"window": (512, 32), "compressed": (512, 16), "index_key": (128, 32)}[fmt]
    width = d if fmt == "window" else d // 2
    payload = _codes(rows, width, skip_nan=fmt == "window")
    choice = E4M3 if fmt == "compressed" else E8M0
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor(choice, dtype=torch.uint8)[
        torch.randint(len(choice), (rows, d // group), generator=g)]
    ids = _ids(rows)
    case = {"format": "fp8" if fmt == "window" else "fp4", "d": d, "group": group,
            "blocks": BLOCKS, "block_size": BLOCK_SIZE, "tokens": TOKENS, "keys": KEYS,
            "scale_e8m0": fmt == "index_key"}
    shape = (BLOCKS, BLOCK_SIZE, 1)
    out = _run(numerics, case, payload.reshape(*shape, width), scales.reshape(*shape, d // group),
               ids)
    safe = ids.clamp(min=0).long()
    if fmt == "window":
        gold = dequantize_window_kv(payload.view(torch.float8_e4m3fn)[safe], scales[safe])
    elif fmt == "compressed":
        gold = dequantize_compressed_kv(payload[safe], scales.view(torch.float8_e4m3fn)[safe])
    else:
        gold = dequantize_index_key(payload[safe], scales[safe])
    assert torch.equal(bits(out), bits(gold.to(torch.bfloat16)))
