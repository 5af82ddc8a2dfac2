"""Deterministic fixture pieces shared by entries.

Every random draw comes from :func:`generator` keyed by the case seed and a tag, so a
fixture is reproducible piece by piece and adding a tensor never shifts another's values.
Output buffers start as a sentinel so a missing write is caught; block tables are
nonidentity permutations so an index slip reads the wrong page.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib

import torch

SENTINEL = 13.0  # value of unwritten output rows (the reference harness uses 13.0 too)
# FP32 buffers whose written values are BF16 values (the mHC residual streams): 13.0 is a
# common stream value at FLASH (1,475 elements in the four TP ranks' hc_post outputs of
# one 192-token decode_c1a_full case), so a written 13.0 beside a reference one ulp away
# read as a missing write.  No BF16 value equals this FP32 one: only an unwritten element
# can hold it.
STREAM_SENTINEL = 13.0 + 2.0 ** -19


def generator(seed: int, *tags: object) -> torch.Generator:
    """A torch generator seeded from ``seed`` and ``tags`` through sha256 (stable across runs)."""
    text = "/".join([str(seed), *map(str, tags)]).encode()
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(text).digest()[:8], "little"))


def randn(shape, seed: int, tag: str, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Normal draws in FP32 scaled by ``scale``, then cast once to ``dtype``."""
    return (torch.randn(*shape, generator=generator(seed, tag)) * scale).to(dtype)


def uniform(shape, seed: int, tag: str, low: float, high: float,
            dtype=torch.float32) -> torch.Tensor:
    g = generator(seed, tag)
    return (torch.rand(*shape, generator=g) * (high - low) + low).to(dtype)


def sentinel(shape, dtype=torch.bfloat16, value: float = SENTINEL) -> torch.Tensor:
    """An output buffer every element of which holds the sentinel."""
    return torch.full(tuple(shape), value, dtype=dtype)


def nonidentity_permutation(n: int, seed: int, tag: str) -> torch.Tensor:
    """A random permutation of ``range(n)`` that is not the identity (for n > 1)."""
    perm = torch.randperm(n, generator=generator(seed, tag))
    if n > 1 and torch.equal(perm, torch.arange(n)):
        perm = perm.roll(1)
    return perm


def block_table(pages_per_request: list[int], num_blocks: int, seed: int, tag: str,
                width: int | None = None) -> torch.Tensor:
    """INT32 [B, width] page table: distinct physical pages drawn from a nonidentity
    permutation of ``num_blocks``; unused columns are -1."""
    need = sum(pages_per_request)
    if need > num_blocks:
        raise ValueError(f"num_blocks: {num_blocks} < pages needed {need}")
    width = max(pages_per_request, default=0) if width is None else width
    perm = nonidentity_permutation(num_blocks, seed, tag)
    table = torch.full((len(pages_per_request), max(width, 1)), -1, dtype=torch.int32)
    at = 0
    for r, n in enumerate(pages_per_request):
        table[r, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return table


def split_lengths(total: int, requests: int, seed: int, tag: str,
                  allow_empty: bool = False) -> list[int]:
    """Random composition of ``total`` rows into ``requests`` lengths (each >= 1 unless
    ``allow_empty``), deterministic in the seed."""
    if requests < 1:
        raise ValueError(f"requests: {requests} must be >= 1")
    floor = 0 if allow_empty else 1
    if total < floor * requests:
        raise ValueError(f"total: {total} rows cannot fill {requests} requests of >= {floor}")
    g = generator(seed, tag)
    cuts = torch.randint(0, total - floor * requests + 1, (requests - 1,), generator=g).sort().values
    edges = [0, *cuts.tolist(), total - floor * requests]
    return [edges[i + 1] - edges[i] + floor for i in range(requests)]


_PLACEHOLDERS = contextvars.ContextVar("v41_weight_placeholders", default=False)


@contextlib.contextmanager
def weight_placeholders():
    """Within this block :func:`placeholders_wanted` is True: a fixture may give its routed
    expert weights as constant placeholders (right names, shapes and dtypes, broadcast views,
    no values drawn or quantized).  Only for estimate-only runs (``harness.bench
    --estimate-only``): the cost model reads shapes and integer metadata, never weight
    values, and such a run computes and compares nothing."""
    token = _PLACEHOLDERS.set(True)
    try:
        yield
    finally:
        _PLACEHOLDERS.reset(token)


def placeholders_wanted() -> bool:
    """True inside :func:`weight_placeholders`."""
    return _PLACEHOLDERS.get()


def is_broadcast(t: torch.Tensor) -> bool:
    """A broadcast view: stride 0 on an axis longer than 1 (a placeholder weight)."""
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def clone_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Independent copies for a SUT or golden.  Broadcast views (placeholders, read only)
    are passed as they are: cloning would materialize them."""
    return {k: v if is_broadcast(v) else v.clone() for k, v in tensors.items()}
