"""A kernel module whose builder dies (or hangs) on purpose (worker isolation tests)."""

import ctypes
import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class _Arg:
    name: str
    shape: tuple
    dtype: str
    role: str


def abi(config, case):
    return (_Arg("x", (4,), "float32", "in"), _Arg("y", (4,), "float32", "out"))


def build(config, case, *, runtime_options=None, mode="abort"):
    if mode == "abort":
        os.abort()
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "exit":
        os._exit(3)
    if mode == "sleep":  # a launch that is still running when its parent is killed
        time.sleep(600)
    raise RuntimeError(f"deliberate failure ({mode})")
