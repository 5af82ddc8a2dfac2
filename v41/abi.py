"""ABI records shared by the v41 kernel modules (no pypto import).

A kernel module declares ``ABI``: a tuple of :class:`Arg` in call order, whose ``dims`` are
dimension names (or ints).  :func:`resolve` turns it into :class:`ResolvedArg` records with
concrete shapes for one launch, the records ``harness.platforms`` reads (``name``,
``shape``, ``dtype`` as a torch dtype name, ``role`` in ``"in" | "out" | "inout"``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arg:
    """One kernel argument: ``dims`` are names resolved by a module's ``dims`` (or ints)."""

    name: str
    dims: tuple
    dtype: str  # torch dtype name
    role: str  # "in" | "out" | "inout"


@dataclass(frozen=True)
class ResolvedArg:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str


def resolve(abi: tuple[Arg, ...], dims: dict[str, int]) -> tuple[ResolvedArg, ...]:
    """``abi`` with every named dimension replaced by its value in ``dims``."""
    out = []
    for a in abi:
        missing = [x for x in a.dims if isinstance(x, str) and x not in dims]
        if missing:
            raise ValueError(f"{a.name}: dimension(s) {missing} not resolved (known {sorted(dims)})")
        out.append(ResolvedArg(a.name, tuple(dims[x] if isinstance(x, str) else int(x)
                                             for x in a.dims), a.dtype, a.role))
    return tuple(out)


def case_int(case: dict, key: str, default=None, minimum: int = 0) -> int:
    """``case[key]`` (or ``default`` when absent/None) as an int >= ``minimum``; raises
    ValueError naming the field otherwise."""
    value = case.get(key) if case else None
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"case[{key!r}]: {value!r} must be an int >= {minimum}")
    return value


def jit_options(runtime_options: dict | None = None) -> dict:
    """Runtime options of every v41 jit kernel, with the caller's on top.

    ``stitch_function_max_num=128`` lets the compiler stitch more functions into one
    submission; on the A5 cost model it roughly halves the estimated time."""
    options = {"stitch_function_max_num": 128}
    options.update(runtime_options or {})
    return options
