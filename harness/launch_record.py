"""Opt-in record of every v41 launch a kernel SUT makes (``V41_RECORD_LAUNCHES=DIR``).

Each launch of :class:`harness.entries.attention_kernels.RankLauncher` (a memo hit too:
its outputs are what the next launch was handed) is saved as
``DIR/<seq>_<module>_r<rank>.pt``: ``{"module", "rank", "axes", "args", "outs"}`` with every
argument and output tensor of at most :data:`LIMIT` bytes (weights past that are left out:
they are the case's fixture, rebuilt by whoever reads the record).  Nothing is recorded
unless the variable is set; recording never changes what a launch computes.
:mod:`harness.trace_row` reads the records back to trace one output row stage by stage.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path

import torch

ENV = "V41_RECORD_LAUNCHES"
LIMIT = 64 << 20  # bytes: larger tensors (FLASH weights) are not recorded
_SEQ = itertools.count()
_NAME = re.compile(r"^(\d+)_(.+)_r(\d+)\.pt$")


def directory() -> Path | None:
    """The record directory named by ``V41_RECORD_LAUNCHES`` (created), or None (off)."""
    where = os.environ.get(ENV)
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def note_case(case) -> None:
    """Write ``case`` as ``DIR/case.json`` if recording is on: one case per directory, so a
    directory already holding another case's records is refused (ValueError) before any
    launch."""
    where = directory()
    if where is None:
        return
    fields = dataclasses.asdict(case)
    path = where / "case.json"
    if path.exists():
        held = json.loads(path.read_text())
        if held != json.loads(json.dumps(fields)):
            raise ValueError(f"{ENV}: {where} already holds the records of case {held}; "
                             f"give each case its own directory")
        return
    path.write_text(json.dumps(fields, indent=1))


def recorded_case(where: str | Path) -> dict | None:
    """The case fields ``note_case`` wrote into ``where`` (None if there are none)."""
    path = Path(where) / "case.json"
    return json.loads(path.read_text()) if path.exists() else None


def _small(tensors: dict) -> dict:
    return {k: v.detach().clone() for k, v in tensors.items()
            if isinstance(v, torch.Tensor) and v.numel() * v.element_size() <= LIMIT}


def record(module: str, rank: int, axes: dict, args: dict, outs: dict) -> None:
    """Save one launch if recording is on (see the module doc); sequence numbers follow
    launch order within the process and never repeat one already in the directory."""
    where = directory()
    if where is None:
        return
    seq = next(_SEQ)
    while any(where.glob(f"{seq:05d}_*")):  # a number another launch or process already used
        seq = next(_SEQ)
    path = where / f"{seq:05d}_{module}_r{rank}.pt"
    torch.save({"module": module, "rank": rank, "axes": dict(axes), "args": _small(args),
                "outs": _small(outs)}, path)


def load(where: str | Path, rank: int) -> dict[str, list[dict]]:
    """Rank ``rank``'s records in ``where`` by module, each module's in launch order."""
    found = []
    for path in Path(where).iterdir():
        m = _NAME.match(path.name)
        if m and int(m.group(3)) == rank:
            found.append((int(m.group(1)), path))
    if not found:
        raise FileNotFoundError(f"{where}: no launch record of rank {rank} (run the case with {ENV}={where})")
    by_module: dict[str, list[dict]] = {}
    for _, path in sorted(found):
        rec = torch.load(path, weights_only=False)
        by_module.setdefault(rec["module"], []).append(rec)
    return by_module


def ranks(where: str | Path) -> list[int]:
    """The ranks with at least one record in ``where``."""
    return sorted({int(m.group(3)) for p in Path(where).iterdir() if (m := _NAME.match(p.name))})
