"""a5sim: the pypto 0.2.0 behaviour v41.window_publish relies on to skip a row without a
runtime ``if``: an ``assemble`` of a computed ``[1, 1, 1, W]`` view whose valid row count is
a runtime 0 writes nothing, and with count 1 writes the row at a runtime 4-D offset.

This module is also the kernel (``abi`` / ``build``), launched by name: each token's FP32
row (integers 0..255) is cast to uint8 and written at cache row ``slot`` when ``slot >= 0``;
the rows all sit in one task (``sg_set_scope``), as in the window cache writes.  Negative
slots land on row 0 if the zero-row view were written anyway."""

# No ``from __future__ import annotations``: the pypto frontend reads the kernel's
# parameter annotations as objects.
from pathlib import Path

import torch

from goldens.config import TINY
from harness.platforms import KernelSpec, get_platform
from v41.abi import Arg, resolve

HERE = Path(__file__).resolve().parent
ROWS, WIDTH, BLOCKS, BLOCK_SIZE = 4, 32, 3, 4

ABI = (
    Arg("vals", ("tokens", WIDTH), "float32", "in"),
    Arg("slots", ("tokens",), "int32", "in"),
    Arg("cache", (BLOCKS, BLOCK_SIZE, 1, WIDTH), "uint8", "inout"),
)


def abi(config, case):
    return resolve(ABI, {"tokens": case["tokens"]})


def build(config, case, *, runtime_options=None):
    import pypto  # noqa: PLC0415  (worker side only)

    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=runtime_options or {})
    def zero_row_assemble(
        vals: pypto.Tensor([tokens_dim, WIDTH], pypto.DT_FP32),
        slots: pypto.Tensor([tokens_dim], pypto.DT_INT32),
        cache: pypto.Tensor([BLOCKS, BLOCK_SIZE, 1, WIDTH], pypto.DT_UINT8),
    ):
        tokens = vals.shape[0]
        for i in pypto.loop((tokens + ROWS - 1) // ROWS, name="ZR_TILES", idx_name="i"):
            pypto.set_pass_options(sg_set_scope=901)
            start = i * ROWS
            valid = (tokens - start).min(ROWS)
            pypto.set_vec_tile_shapes(ROWS, WIDTH)
            x = pypto.mul(pypto.view(vals, [ROWS, WIDTH], [start, 0], valid_shape=[valid, WIDTH]),
                          1.0)
            pypto.set_vec_tile_shapes(ROWS, 1, 1, WIDTH)
            x4 = pypto.reshape(x, [ROWS, 1, 1, WIDTH], valid_shape=[valid, 1, 1, WIDTH])
            for r in range(ROWS):
                slot = slots[(start + r).min(tokens - 1)]
                live = (slot + 1).max(0).min(1).min((valid - r).max(0))
                row = slot.max(0)
                pypto.assemble(pypto.cast(pypto.view(x4, [1, 1, 1, WIDTH], [r, 0, 0, 0],
                                                     valid_shape=[live, 1, 1, WIDTH]),
                                          pypto.DT_UINT8),
                               [row // BLOCK_SIZE, row % BLOCK_SIZE, 0, 0], cache)
            pypto.set_pass_options(sg_set_scope=-1)

    return zero_row_assemble


def test_zero_row_view_assemble_writes_nothing(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    slots = torch.tensor([5, -1, 9, -7, 2, 11], dtype=torch.int32)  # 6 tokens: a partial tile
    n = slots.numel()
    vals = torch.arange(n * WIDTH, dtype=torch.float32).reshape(n, WIDTH).remainder(251) + 1
    cache = torch.full((BLOCKS, BLOCK_SIZE, 1, WIDTH), 0xAB, dtype=torch.uint8)
    want = cache.clone().reshape(-1, WIDTH)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            want[s] = vals[t].to(torch.uint8)
    platform = get_platform("a5sim")
    try:
        program = platform.compile(KernelSpec("test_a5sim_zero_row_assemble"), TINY, {"tokens": n})
        res = platform.launch(program, 0, {"vals": vals, "slots": slots, "cache": cache.clone()})
    finally:
        platform.close()
    res.raise_for_error()
    out = res.outputs["cache"].reshape(-1, WIDTH)
    assert torch.equal(out[0], want[0]), "a zero-row view was written at row 0"
    assert torch.equal(out, want)
