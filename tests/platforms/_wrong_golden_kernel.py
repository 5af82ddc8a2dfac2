"""v41.rmsnorm with a deliberately wrong golden handed to pypto's verifier, so the
verifier writes a real ``tensor_graph ... result FAILED`` (FB4001) line for the launch."""

from v41 import rmsnorm

abi = rmsnorm.abi


def build(config, case, *, runtime_options=None):
    import pypto  # noqa: PLC0415  (worker side only)
    import torch  # noqa: PLC0415

    kernel = rmsnorm.build(config, case, runtime_options=runtime_options)

    def run(x, weight, y):
        wrong = torch.full(tuple(y.shape), 7.0, dtype=y.dtype)  # RMSNorm output is never 7
        pypto.set_verify_golden_data(goldens=[None, None, wrong])
        return kernel(x, weight, y)

    return run
