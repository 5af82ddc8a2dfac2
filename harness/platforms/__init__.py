"""Platforms that run v41 kernels: ``a5sim`` (CPU interpreter + A5 cost model) and ``a5``.

Public API::

    get_platform(name: str, **kwargs) -> Platform          # "a5sim" | "a5"; verify=...
    Platform.available() -> tuple[bool, str]
    Platform.compile(kernel_spec: KernelSpec, config, case) -> Program
    Platform.launch(program: Program, rank: int, tensors: Mapping[str, Tensor]) -> LaunchResult
    Platform.close()                                         # also a context manager
    Platform.verify_level                                    # a5sim: "tensor" | "lowered"
    LaunchResult: ok, outputs, cost (CostReport | None), timings, error, log_path, run_dir, rank,
                  details (a5sim: verify summary, worker pid/job, kernel cache hit)

Nothing here imports pypto: it is imported only inside launch workers, after
:mod:`harness.platforms.pypto_env` has configured the process.
"""

from harness.platforms.base import (CostReport, KernelSpec, LaunchError, LaunchResult, Platform,
                                    PlatformError, Program, TensorArg)

PLATFORM_NAMES = ("a5sim", "a5")


def get_platform(name: str, **kwargs) -> Platform:
    """A new platform object for ``name``; ``kwargs`` go to its constructor.

    ``verify`` (a5sim: ``"tensor"`` | ``"lowered"``, None reads ``V41_VERIFY``) is accepted
    for every platform; ``a5`` runs on cards, has no pass verifier and refuses a level."""
    if name == "a5sim":
        from harness.platforms.a5sim import A5SimPlatform
        return A5SimPlatform(**kwargs)
    if name == "a5":
        from harness.platforms.a5 import A5Platform
        if kwargs.pop("verify", None) is not None:
            raise PlatformError("verify: the a5 platform has no pass verifier (a5sim only)")
        return A5Platform(**kwargs)
    raise PlatformError(f"platform: {name!r} is not one of {PLATFORM_NAMES}")


__all__ = ["PLATFORM_NAMES", "CostReport", "KernelSpec", "LaunchError", "LaunchResult",
           "Platform", "PlatformError", "Program", "TensorArg", "get_platform"]
