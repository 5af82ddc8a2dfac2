"""Replay saved cases: ``python -m harness.replay out/data/sharded [--rerun]``.

Every comparison is re-run from the files on disk (entry comparators over the saved
inputs, golden and actual outputs); with ``--rerun`` the system under test runs again on
the saved inputs as well.  A tree saved for the other wiring is refused; a missing,
corrupted or tampered file is named.  Exit status 1 on any failure or data error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import torch

from harness import registry
from harness.data import DataError, case_folders, load_case
from harness.fixtures import clone_tensors
from harness.runner import load_platform
from harness.verdict import Verdict, all_passed


@dataclass
class ReplayResult:
    folder: str
    case_id: str
    status: str  # pass | fail | error
    saved_status: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    reason: str = ""

    @property
    def same_as_saved(self) -> bool:
        return self.saved_status == self.status


def replay_folder(folder, expect_wiring: str | None = None, rerun: bool = False) -> ReplayResult:
    """Re-run one saved case's comparisons (and its SUT with ``rerun``)."""
    try:
        case, manifest, tensors = load_case(folder, expect_wiring)
    except DataError as err:
        return ReplayResult(str(folder), "?", "error", reason=str(err))
    entry = registry.get(case.entry)
    cfg = case.config
    inputs, golden, actual = tensors["inputs"], tensors["golden"], tensors["actual"]
    why = integrity_problem(entry, case, inputs, golden)
    if why:
        return ReplayResult(str(folder), case.case_id, "error", manifest["status"], reason=why)
    if rerun:
        label, sut = entry.sut_for(case.platform)
        if sut is None:
            return ReplayResult(str(folder), case.case_id, "error", manifest["status"],
                                reason=f"no system under test on {case.platform}")
        platform = load_platform(case.platform) if label.startswith("kernel:") else None
        if platform is not None:
            ok, why = platform.available()
            if not ok:
                return ReplayResult(str(folder), case.case_id, "error", manifest["status"],
                                    reason=f"--rerun impossible: {why}")
        actual = sut(platform, cfg, case, clone_tensors(inputs)).outputs
    verdicts = entry.compare(cfg, case, inputs, golden, actual)
    status = "pass" if verdicts and all_passed(verdicts) else "fail"
    return ReplayResult(str(folder), case.case_id, status, manifest["status"], verdicts)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact for integer and 8-bit storage; floats within FP32 reassociation noise."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    if not a.is_floating_point():
        return torch.equal(a, b)
    x, y = a.double(), b.double()
    if not torch.equal(torch.isnan(x), torch.isnan(y)):
        return False
    x, y = x.nan_to_num(), y.nan_to_num()
    return bool(((x - y).abs() <= 1e-6 * y.abs().amax() + 1e-30).all())


def integrity_problem(entry, case, inputs, golden) -> str:
    """Why the saved inputs or golden cannot belong to the manifest's case, or ''.

    Inputs are deterministic in the case axes and the seed, and the golden in the inputs,
    so an edited manifest (axes, seed), swapped inputs or a swapped golden is caught even
    when the sha256 values were rewritten to match."""
    cfg = case.config
    rebuilt = entry.build_inputs(cfg, case)
    if set(rebuilt) != set(inputs):
        return "inputs.safetensors: tensor names differ from what the manifest's case produces"
    bad = sorted(k for k in rebuilt if not _same(inputs[k], rebuilt[k]))
    if bad:
        return (f"inputs.safetensors: {len(bad)} tensors differ from what the manifest's case "
                f"axes and seed produce (first: {bad[0]})")
    recomputed = entry.golden(cfg, case, clone_tensors(inputs))
    bad = sorted(k for k in recomputed if k not in golden or not _same(golden[k], recomputed[k]))
    if bad:
        return (f"golden.safetensors: {len(bad)} tensors differ from the golden recomputed from "
                f"the inputs (first: {bad[0]})")
    return ""


def replay_tree(tree, wiring: str | None = None, rerun: bool = False) -> list[ReplayResult]:
    """Replay every case under ``tree`` (a wiring folder, or a root holding wiring folders).

    ``wiring`` (if given) must match the tree's wiring folder; otherwise the tree is refused.
    """
    tree_wiring, folders = case_folders(tree)
    if wiring is not None and tree_wiring is not None and wiring != tree_wiring:
        raise DataError(f"{tree}: tree saved for wiring {tree_wiring!r}, refused for {wiring!r}")
    expect = wiring or tree_wiring
    if not folders:
        raise DataError(f"{tree}: no saved cases")
    out = []
    for folder in folders:
        w = expect or folder.parent.name
        out.append(replay_folder(folder, w, rerun))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.replay", description=__doc__.splitlines()[0])
    ap.add_argument("tree", help="out/data/<wiring> or out/data")
    ap.add_argument("--wiring", choices=("replicated", "sharded"), default=None,
                    help="refuse a tree saved for the other wiring")
    ap.add_argument("--rerun", action="store_true", help="run the system under test again")
    args = ap.parse_args(argv)
    from harness.report import print_replay
    try:
        results = replay_tree(args.tree, args.wiring, args.rerun)
    except DataError as err:
        print(f"replay refused: {err}", file=sys.stderr)
        return 1
    print_replay(results)
    return 0 if all(r.status == "pass" and r.same_as_saved for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
