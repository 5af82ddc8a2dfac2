"""Case data on disk: ``<root>/<wiring>/<case_id>/`` with safetensors and a manifest.

Files: ``inputs.safetensors`` (every tensor the operator reads, output buffers as the
SUT received them), ``golden.safetensors``, ``actual.safetensors`` and ``manifest.json``
(format version, case axes, SUT label, status, verify level, verdicts with their bounds,
costs, sha256 per file, package versions).  Tensors are safetensors, never pickle.
:func:`load_case` checks the manifest against the format's schema (:func:`manifest_case`),
verifies every hash and names a missing, corrupted or tampered file or manifest field.
"""

from __future__ import annotations

import hashlib
import json
import platform as pyplatform
import re
import types
import typing
from dataclasses import asdict, fields
from importlib import metadata
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harness.case import WIRINGS, Case

TENSOR_FILES = ("inputs", "golden", "actual")
MANIFEST = "manifest.json"
FORMAT_VERSION = 3  # 2: every field below required, verify_level; 3: sut kind + sut_label
MANIFEST_FIELDS = ("format", "case", "case_id", "sut", "sut_label", "status", "verify_level",
                   "verdicts", "costs", "sha256", "versions")
SUT_KINDS = ("kernel", "golden-alt")  # manifest "sut"; "sut_label" is "<kind>:<name>"
SAVED_STATUSES = ("pass", "fail")  # a case is saved only once it was compared
VERDICT_FIELDS = {"output": str, "check": str, "passed": bool, "row": str, "measured": float,
                  "bound": float, "relation": str}
RELATIONS = ("<=", "<", ">=")
_CASE_TYPES = typing.get_type_hints(Case)
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        "sut": result.sut_kind,
        "sut_label": result.sut,
        "status": result.status,
        "verify_level": getattr(result, "verify_level", None),
        "verdicts": [{"output": v.output, "check": v.check, "passed": v.passed,
                      "row": str(v.row), "measured": v.measured, "bound": v.bound,
                      "relation": v.relation} for v in result.verdicts],
        "costs": result.costs,
        "sha256": hashes,
        "versions": package_versions(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return folder


def read_manifest(folder: str | Path) -> dict:
    """The parsed ``manifest.json`` of ``folder``, unchecked; DataError if missing or not JSON."""
    mpath = Path(folder) / MANIFEST
    if not mpath.is_file():
        raise DataError(f"{mpath}: missing manifest")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{mpath}: corrupted manifest ({err})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{mpath}: corrupted manifest (not a JSON object)")
    return manifest


def _is(value, kind) -> bool:
    """isinstance without bool passing for int, and with int accepted as float; a union
    accepts any of its members, ``tuple[int, ...]`` a JSON list of ints."""
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return any(_is(value, k) for k in typing.get_args(kind))
    if typing.get_origin(kind) is tuple:
        return isinstance(value, list) and all(_is(v, int) for v in value)
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def manifest_case(manifest: dict, where: str | Path = MANIFEST) -> Case:
    """The :class:`Case` of a manifest that follows format :data:`FORMAT_VERSION` exactly.

    Every field of :data:`MANIFEST_FIELDS` and every case axis must be present with its
    type, nothing else may be; ``case_id`` must be the axes' id, ``status`` a saved one,
    each verdict must carry :data:`VERDICT_FIELDS`, ``sha256`` one digest per tensor file.
    Raises :class:`DataError` naming the first wrong field (``verdicts[2].bound``, ...).
    Whether the verdicts are the entry's current ones is the replay's check.
    """
    def bad(name: str, why: str):
        raise DataError(f"{where}: {name}: {why}")

    fmt = manifest.get("format")
    if not _is(fmt, int) or fmt != FORMAT_VERSION:
        bad("format", f"{fmt!r}, this harness reads format {FORMAT_VERSION} only (save the case "
                      f"again with --save-data)")
    for name in MANIFEST_FIELDS:
        if name not in manifest:
            bad(name, "missing")
    for name in manifest:
        if name not in MANIFEST_FIELDS:
            bad(name, f"unknown field (format {FORMAT_VERSION} has {', '.join(MANIFEST_FIELDS)})")
    axes = manifest["case"]
    if not isinstance(axes, dict):
        bad("case", "not an object of case axes")
    for f in fields(Case):
        if f.name not in axes:
            bad(f"case.{f.name}", "missing")
        if not _is(axes[f.name], _CASE_TYPES[f.name]):
            bad(f"case.{f.name}", f"{axes[f.name]!r} is not of type {_CASE_TYPES[f.name]}")
    for name in axes:
        if name not in _CASE_TYPES:
            bad(f"case.{name}", "unknown axis")
    case = Case(**axes)
    if manifest["case_id"] != case.case_id:
        bad("case_id", f"{manifest['case_id']!r} is not the id of the case axes ({case.case_id!r})")
    if manifest["sut"] not in SUT_KINDS:
        bad("sut", f"{manifest['sut']!r} is not one of {SUT_KINDS}")
    label = manifest["sut_label"]
    if not isinstance(label, str) or not label.startswith(f"{manifest['sut']}:") \
            or label == f"{manifest['sut']}:":
        bad("sut_label", f"{label!r} is not '{manifest['sut']}:<name>'")
    if manifest["status"] not in SAVED_STATUSES:
        bad("status", f"{manifest['status']!r} is not one of {SAVED_STATUSES}")
    if not (manifest["verify_level"] is None or isinstance(manifest["verify_level"], str)):
        bad("verify_level", f"{manifest['verify_level']!r} is not null or a string")
    verdicts = manifest["verdicts"]
    if not isinstance(verdicts, list) or not verdicts:
        bad("verdicts", "not a non-empty list (a saved case was compared)")
    for i, v in enumerate(verdicts):
        if not isinstance(v, dict):
            bad(f"verdicts[{i}]", "not an object")
        if set(v) != set(VERDICT_FIELDS):
            odd = sorted(set(v) ^ set(VERDICT_FIELDS))[0]
            bad(f"verdicts[{i}].{odd}", "missing" if odd in VERDICT_FIELDS else "unknown field")
        for name, kind in VERDICT_FIELDS.items():
            if not _is(v[name], kind):
                bad(f"verdicts[{i}].{name}", f"{v[name]!r} is not of type {kind.__name__}")
        if v["relation"] not in RELATIONS:
            bad(f"verdicts[{i}].relation", f"{v['relation']!r} is not one of {RELATIONS}")
    costs = manifest["costs"]
    if not isinstance(costs, list) or not all(isinstance(c, dict) for c in costs):
        bad("costs", "not a list of objects")
    digests = manifest["sha256"]
    files = [f"{n}.safetensors" for n in TENSOR_FILES]
    if not isinstance(digests, dict):
        bad("sha256", "not an object of file digests")
    for name in files:
        if name not in digests:
            bad(f"sha256.{name}", "missing")
        if not isinstance(digests[name], str) or not _SHA256.fullmatch(digests[name]):
            bad(f"sha256.{name}", f"{digests[name]!r} is not a sha256 hex digest")
    for name in digests:
        if name not in files:
            bad(f"sha256.{name}", f"unknown file (expected {', '.join(files)})")
    versions = manifest["versions"]
    if not isinstance(versions, dict) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in versions.items()):
        bad("versions", "not an object of package name to version string")
    return case


def load_case(folder: str | Path, expect_wiring: str | None = None):
    """(case, manifest, {inputs, golden, actual}) of a saved case folder, verified.

    Raises :class:`DataError` naming the manifest field that breaks the schema, the file
    that is missing, corrupted or tampered, or the wiring when the tree belongs to the
    other one.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    case = manifest_case(manifest, folder / MANIFEST)
    if expect_wiring is not None and case.wiring != expect_wiring:
        raise DataError(f"{folder}: saved for wiring {case.wiring!r}, refused for "
                        f"wiring {expect_wiring!r}")
    tensors = {}
    for name in TENSOR_FILES:
        path = folder / f"{name}.safetensors"
        if not path.is_file():
            raise DataError(f"{path}: missing")
        if sha256(path) != manifest["sha256"][path.name]:
            raise DataError(f"{path}: sha256 mismatch (tampered or corrupted)")
        try:
            tensors[name] = load_file(str(path))
        except Exception as err:  # noqa: BLE001 - any parse failure means corrupted
            raise DataError(f"{path}: corrupted ({err})") from None
    return case, manifest, tensors


def case_folders(tree: str | Path, wiring: str | None = None) -> list[tuple[Path, str | None]]:
    """(case folder, wiring it must hold or None) for every case ``tree`` holds.

    ``tree`` is a case folder (it holds a manifest), a wiring folder (``.../sharded``) or a
    data root holding wiring folders.  ``wiring`` restricts a root to ``<tree>/<wiring>``;
    on a wiring or case folder saved under the other wiring it is refused.  Without it,
    each folder must hold the wiring of the folder it sits in.
    """
    tree = Path(tree)
    if not tree.is_dir():
        raise DataError(f"{tree}: not a directory")
    if wiring is not None and wiring not in WIRINGS:
        raise DataError(f"--wiring: {wiring!r} is not one of {WIRINGS}")
    if (tree / MANIFEST).is_file():  # one case folder
        parent = tree.parent.name if tree.parent.name in WIRINGS else None
        _refuse_other(tree, parent, wiring)
        return [(tree, wiring or parent)]
    if tree.name in WIRINGS:
        _refuse_other(tree, tree.name, wiring)
        roots = [tree]
    else:
        roots = [tree / w for w in ((wiring,) if wiring else WIRINGS) if (tree / w).is_dir()]
    folders = sorted(p for r in roots for p in r.iterdir() if p.is_dir())
    if not folders:
        where = f" under {tree / wiring}" if wiring and tree.name not in WIRINGS else ""
        raise DataError(f"{tree}: no saved cases{where}")
    return [(p, p.parent.name) for p in folders]


def _refuse_other(tree: Path, saved: str | None, wiring: str | None) -> None:
    if wiring is not None and saved is not None and saved != wiring:
        raise DataError(f"{tree}: tree saved for wiring {saved!r}, refused for {wiring!r}")
