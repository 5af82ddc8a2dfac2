"""Kernels that only decode packed weights to BF16, for the exactness tests of the in-kernel
weight decoders (``tests/platforms/test_a5sim_weight_decode.py``); no model entry uses them.

* :func:`build_fp4`: ``lo``/``hi`` planes of a packed MXFP4 expert matrix ``[1, N, K/2]``
  (:func:`v41.mx_fp4_decode.fp4_pair_tile`, whole rows, ``N_TILE`` rows a tile).
* :func:`build_fp8`: an MXFP8 linear weight ``[N, K]`` (:func:`v41.mx_linear
  .mx_weight_tile_bf16`), by the whole-row table path (``table=True``) or the arithmetic one.

Golden: ``goldens.quant.dequantize_fp4_expert_weight`` / ``dequantize_fp8_weight`` (exact).
"""

from v41 import mx_fp4_decode, mx_linear
from v41.abi import Arg, case_int, jit_options, resolve

N_TILE = 64  # weight rows decoded per tile

FP4_ABI = (Arg("packed", (1, "n", "kh"), "uint8", "in"),
           Arg("scales", (1, "n", "groups"), "uint8", "in"),
           Arg("lo", ("n", "kh"), "bfloat16", "out"),
           Arg("hi", ("n", "kh"), "bfloat16", "out"))
FP8_ABI = (Arg("w", ("n", "k"), "uint8", "in"),
           Arg("ws", ("nb", "kb"), "uint8", "in"),
           Arg("out", ("n", "k"), "bfloat16", "out"))


def _dims(case):
    n, k = case_int(case, "n", minimum=N_TILE), case_int(case, "k", minimum=32)
    if n % N_TILE or k % 32:
        raise ValueError(f"case: n {n} must be a multiple of {N_TILE}, k {k} of 32")
    return n, k


def abi_fp4(config, case):
    """``case``: ``n`` rows, ``k`` logical columns (``kh = k / 2`` packed bytes)."""
    n, k = _dims(case)
    return resolve(FP4_ABI, {"n": n, "kh": k // 2, "groups": k // 32})


def abi_fp8(config, case):
    n, k = _dims(case)
    return resolve(FP8_ABI, {"n": n, "k": k, "nb": n // 32, "kb": k // 32})


def build_fp4(config, case, runtime_options=None):
    """The jit kernel ``decode_fp4(packed, scales, lo, hi)``."""
    import pypto  # noqa: PLC0415

    n, k = _dims(case)
    kh = k // 2

    @pypto.frontend.jit(runtime_options=jit_options(runtime_options))
    def decode_fp4(packed: pypto.Tensor([1, n, kh], pypto.DT_UINT8),
                   scales: pypto.Tensor([1, n, k // 32], pypto.DT_UINT8),
                   lo: pypto.Tensor([n, kh], pypto.DT_BF16),
                   hi: pypto.Tensor([n, kh], pypto.DT_BF16)):
        tables = mx_fp4_decode.byte_tables(pypto)
        for t in pypto.loop(n // N_TILE, name="PROBE_FP4", idx_name="t"):
            a, b = mx_fp4_decode.fp4_pair_tile(pypto, packed, scales, tables, 0, t * N_TILE,
                                               N_TILE)
            pypto.set_vec_tile_shapes(16, mx_linear.cols(kh))
            pypto.assemble(a, [t * N_TILE, 0], lo)
            pypto.assemble(b, [t * N_TILE, 0], hi)
    return decode_fp4


def build_fp8(config, case, table=True, runtime_options=None):
    """The jit kernel ``decode_fp8(w, ws, out)``."""
    import pypto  # noqa: PLC0415

    n, k = _dims(case)

    @pypto.frontend.jit(runtime_options=jit_options(runtime_options))
    def decode_fp8(w: pypto.Tensor([n, k], pypto.DT_UINT8),
                   ws: pypto.Tensor([n // 32, k // 32], pypto.DT_UINT8),
                   out: pypto.Tensor([n, k], pypto.DT_BF16)):
        tab = mx_linear.e4m3_table(pypto) if table else None
        for t in pypto.loop(n // N_TILE, name="PROBE_FP8", idx_name="t"):
            wt = mx_linear.mx_weight_tile_bf16(pypto, w, ws, t * N_TILE, 0, N_TILE, k,
                                               table=tab)
            pypto.set_vec_tile_shapes(16, mx_linear.cols(k))
            pypto.assemble(wt, [t * N_TILE, 0], out)
    return decode_fp8
