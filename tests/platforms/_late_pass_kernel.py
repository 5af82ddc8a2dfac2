"""v41.gate with pass verification forced onto InferParamIndex, a pass after
SubgraphToFunction that ``lowered`` leaves out because pypto 0.2.0's calculator reads
gate's index output back as zeros there: a real pass-level ``FAILED`` (FB4001) line."""

from v41 import gate

abi = gate.abi


def build(config, case, *, runtime_options=None):
    import pypto  # noqa: PLC0415  (worker side only)

    kernel = gate.build(config, case, runtime_options=runtime_options)

    def run(*tensors):
        pypto.set_verify_options(pass_verify_pass_filter=["InferParamIndex"])
        return kernel(*tensors)

    return run
