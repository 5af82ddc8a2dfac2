"""Case data on disk: ``<root>/<wiring>/<case_id>/`` with safetensors and a manifest.

Files: ``inputs.safetensors`` (every tensor the operator reads, output buffers as the
SUT received them), ``golden.safetensors``, ``actual.safetensors`` and ``manifest.json``
(case axes, preset, seed, SUT label, verdicts with their bounds, sha256 per file, package
versions).  Tensors are safetensors, never pickle.  :func:`load_case` verifies every hash
and names a missing, corrupted or tampered file.
"""

from __future__ import annotations

import hashlib
import json
import platform as pyplatform
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harness.case import WIRINGS, Case

TENSOR_FILES = ("inputs", "golden", "actual")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class DataError(ValueError):
    """A saved tree that is missing, corrupted, tampered or of the wrong wiring."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_versions() -> dict[str, str]:
    out = {"python": pyplatform.python_version()}
    for pkg in ("torch", "pypto", "numpy", "safetensors", "rich"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def case_dir(root: str | Path, case: Case) -> Path:
    return Path(root) / case.wiring / case.case_id


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in tensors.items()}


def save_case(root: str | Path, result, inputs, golden, actual) -> Path:
    """Write one case's tree and return its folder.  ``result`` is a CaseResult."""
    folder = case_dir(root, result.case)
    folder.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name, tensors in zip(TENSOR_FILES, (inputs, golden, actual)):
        path = folder / f"{name}.safetensors"
        save_file(_contiguous(tensors), str(path))
        hashes[path.name] = sha256(path)
    manifest = {
        "format": FORMAT_VERSION,
        "case": asdict(result.case),
        "case_id": result.case.case_id,
        "sut": result.sut,
        "status": result.status,
        "verdicts": [{"output": v.output, "check": v.check, "passed": v.passed,
                      "row": str(v.row), "measured": v.measured, "bound": v.bound,
                      "relation": v.relation} for v in result.verdicts],
        "costs": result.costs,
        "sha256": hashes,
        "versions": package_versions(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return folder


def load_case(folder: str | Path, expect_wiring: str | None = None):
    """(case, manifest, {inputs, golden, actual}) of a saved case folder, verified.

    Raises :class:`DataError` naming the file that is missing, corrupted or tampered, or
    the wiring when the tree belongs to the other one.
    """
    folder = Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise DataError(f"{mpath}: missing manifest")
    try:
        manifest = json.loads(mpath.read_text())
        case = Case(**manifest["case"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DataError(f"{mpath}: corrupted manifest ({err})") from None
    if expect_wiring is not None and case.wiring != expect_wiring:
        raise DataError(f"{folder}: saved for wiring {case.wiring!r}, refused for "
                        f"wiring {expect_wiring!r}")
    tensors = {}
    for name in TENSOR_FILES:
        path = folder / f"{name}.safetensors"
        if not path.is_file():
            raise DataError(f"{path}: missing")
        want = manifest.get("sha256", {}).get(path.name)
        if want is None:
            raise DataError(f"{path}: no sha256 recorded in the manifest")
        if sha256(path) != want:
            raise DataError(f"{path}: sha256 mismatch (tampered or corrupted)")
        try:
            tensors[name] = load_file(str(path))
        except Exception as err:  # noqa: BLE001 - any parse failure means corrupted
            raise DataError(f"{path}: corrupted ({err})") from None
    return case, manifest, tensors


def case_folders(tree: str | Path) -> tuple[str | None, list[Path]]:
    """(wiring of the tree or None, case folders) for a wiring folder or a data root."""
    tree = Path(tree)
    if not tree.is_dir():
        raise DataError(f"{tree}: not a directory")
    wiring = tree.name if tree.name in WIRINGS else None
    roots = [tree] if wiring is not None else [tree / w for w in WIRINGS if (tree / w).is_dir()]
    folders = sorted(p for r in roots for p in r.iterdir() if p.is_dir())
    return wiring, folders
