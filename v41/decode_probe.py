"""Kernels that only decode packed weights to BF16, for the exactness tests of the in-kernel
weight decoders (``tests/platforms/test_a5sim_weight_decode.py``); no model entry uses them.

* :func:`build_fp4`: ``lo``/``hi`` planes of a packed MXFP4 expert matrix ``[1, N, K/2]``
  (:func:`v41.mx_fp4_decode.fp4_pair_tile`, whole rows, ``N_TILE`` rows a tile).
* :func:`build_fp8`: an MXFP8 linear weight ``[N, K]`` (:func:`v41.mx_linear
  .mx_weight_tile_bf16`), by the whole-row table path (``table=True``) or the arithmetic one.

Golden: ``goldens.quant.dequantize_fp4_expert_weight`` / ``dequantize_fp8_weight`` (exact).
"""

from v41 import kv_decode, mx_decode, mx_fp4_decode, mx_linear
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
        tables = mx_fp4_decode.decode_tables(pypto)
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
        tab = mx_decode.e4m3_table(pypto) if table else None
        for t in pypto.loop(n // N_TILE, name="PROBE_FP8", idx_name="t"):
            wt = mx_linear.mx_weight_tile_bf16(pypto, w, ws, t * N_TILE, 0, N_TILE, k,
                                               table=tab)
            pypto.set_vec_tile_shapes(16, mx_linear.cols(k))
            pypto.assemble(wt, [t * N_TILE, 0], out)
    return decode_fp8


KV_ABI = (Arg("payload", ("blocks", "block_size", 1, "width"), "uint8", "in"),
          Arg("scales", ("blocks", "block_size", 1, "groups"), "uint8", "in"),
          Arg("ids", ("tokens", "keys"), "int32", "in"),
          Arg("out", ("tokens", "keys", "d"), "bfloat16", "out"))


def _kv_dims(case):
    fp4 = case.get("format") == "fp4"
    d, group = case_int(case, "d", minimum=32), case_int(case, "group", 16 if fp4 else 32)
    keys = case_int(case, "keys", minimum=1)
    return {"blocks": case_int(case, "blocks", minimum=1), "block_size":
            case_int(case, "block_size", minimum=1), "width": d // 2 if fp4 else d,
            "groups": d // group, "tokens": case_int(case, "tokens", minimum=1),
            "keys": keys, "d": d, "group": group, "fp4": fp4,
            "e8m0": bool(case.get("scale_e8m0"))}


def abi_kv(config, case):
    """``case``: ``format`` ("fp8" window rows or "fp4" compressed / index-key rows), ``d``,
    ``group``, ``blocks``, ``block_size``, ``tokens``, ``keys``, ``scale_e8m0`` (fp4)."""
    return resolve(KV_ABI, _kv_dims(case))


def build_kv(config, case, runtime_options=None):
    """The jit kernel ``decode_kv(payload, scales, ids, out)``: ``out[t, j]`` = cache row
    ``ids[t, j]`` decoded by :func:`v41.kv_decode.window_keys` or
    :func:`v41.kv_decode.fp4_keys` (row 0 for -1)."""
    import pypto  # noqa: PLC0415

    m = _kv_dims(case)
    rows, g, group, d, keys = m["blocks"] * m["block_size"], m["groups"], m["group"], m["d"], \
        m["keys"]
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=jit_options(runtime_options))
    def decode_kv(payload: pypto.Tensor([m["blocks"], m["block_size"], 1, m["width"]],
                                        pypto.DT_UINT8),
                  scales: pypto.Tensor([m["blocks"], m["block_size"], 1, g], pypto.DT_UINT8),
                  ids: pypto.Tensor([tokens_dim, keys], pypto.DT_INT32),
                  out: pypto.Tensor([tokens_dim, keys, d], pypto.DT_BF16)):
        tokens = ids.shape[0]
        flat = pypto.reshape(payload, [rows * g, m["width"] // g], inplace=True)
        sflat = pypto.reshape(scales, [rows * g], inplace=True)
        key_of = kv_decode.slot_constants(pypto, keys, g)
        if m["fp4"]:
            table = kv_decode.nibble_table(pypto)
            nibbles = kv_decode.nibble_constants(pypto, group)
        else:
            table = mx_decode.e4m3_table(pypto)
        for t in pypto.loop(tokens, name="PROBE_KV", idx_name="t"):
            row = pypto.view(ids, [1, keys], [t, 0])
            if m["fp4"]:
                kb = kv_decode.fp4_keys(pypto, row, flat, sflat, table, key_of, nibbles,
                                        keys, d, group, scale_e8m0=m["e8m0"])
            else:
                kb = kv_decode.window_keys(pypto, row, flat, sflat, table, key_of, keys, d,
                                           group)
            pypto.set_vec_tile_shapes(1, min(keys, 16), d)
            pypto.assemble(pypto.reshape(kb, [1, keys, d]), [t, 0, 0], out)
    return decode_kv
