"""A kernel with a real pass-level ``FAILED`` (FB4001) line at InferParamIndex, a pass after
SubgraphToFunction that ``lowered`` leaves out: pypto 0.2.0's calculator reads an index
built from a 1-D ``arange`` traced under a 2-D vector tile (one-element tiles) back wrong
there.  gate's ABI and inputs; it writes the first ``k`` lanes of that iota, as gate's
argmax picks did before gate built its iota as one tile."""

from v41 import gate
from v41.abi import jit_options

abi = gate.abi


def build(config, case, *, runtime_options=None):
    import pypto  # noqa: PLC0415  (worker side only)

    d = gate.dims(config, case)
    experts, k = d["experts"], d["k"]
    k_tile = (k + 7) // 8 * 8
    tokens_dim = pypto.frontend.dynamic("tokens")

    @pypto.frontend.jit(runtime_options=jit_options(runtime_options))
    def late(
        x_norm: pypto.Tensor([tokens_dim, d["hidden"]], pypto.DT_BF16),
        gate_weight: pypto.Tensor([experts, d["hidden"]], pypto.DT_FP32),
        correction_bias: pypto.Tensor([experts], pypto.DT_FP32),
        num_tokens: pypto.Tensor([1], pypto.DT_INT32),
        indices: pypto.Tensor([tokens_dim, k], pypto.DT_INT32),
        weights: pypto.Tensor([tokens_dim, k], pypto.DT_FP32),
    ):
        tokens = x_norm.shape[0]
        pypto.set_vec_tile_shapes(1, experts)
        iota = pypto.reshape(pypto.arange(0.0, float(experts), 1.0), [1, experts])
        for i in pypto.loop(tokens, name="LATE_ROWS", idx_name="r"):
            pypto.set_vec_tile_shapes(1, k_tile)
            row = pypto.view(iota, [1, k], [0, 0])
            pypto.assemble(pypto.cast(row, pypto.DT_INT32), [i, 0], indices)
            pypto.assemble(pypto.mul(row, 0.5), [i, 0], weights)

    def run(*tensors):
        pypto.set_verify_options(pass_verify_pass_filter=["InferParamIndex"])
        return late(*tensors)

    return run
