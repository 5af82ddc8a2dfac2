"""Replay saved cases: ``python -m harness.replay DIR [--wiring W] [--rerun]``.

``DIR`` is a data root (``out/data``), a wiring folder (``out/data/sharded``) or one case
folder.  Every case's manifest is checked against the saved format's schema, its hashes
and its tensors against its axes, and every comparison is re-run from the files on disk;
the verdict list the entry computes now must have the manifest's names, relations and
bounds.  With ``--rerun`` the system under test runs again on the saved inputs and its
output is compared both with the golden and with the saved actual output.  A tree saved
for the other wiring is refused; a missing, corrupted or tampered file or manifest field
is named.  Exit status 1 on any failure, difference or data error.  ``--plot [OUTDIR]``
draws each failing case's error plots (:mod:`harness.plots.errors`) into ``<case>/plots/``
or ``OUTDIR/<wiring>/<case>/`` and lists them after the table.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from dataclasses import dataclass, field

import torch

from harness import registry
from harness.case import CaseError, validate_case
from harness.data import DataError, MANIFEST, case_folders, load_case, read_manifest
from harness.fixtures import clone_tensors
from harness.runner import load_platform
from harness.verdict import Verdict, all_passed

MODES = {"replay": "comparisons re-run on the saved tensors",
         "rerun": "system under test ran again on the saved inputs; its output compared with "
                  "the golden and with the saved actual output"}


@dataclass
class ReplayResult:
    """One replayed case.  ``status`` judges the replayed output (the fresh one with
    ``--rerun``) against the golden; ``saved_diff`` names verdicts whose pass/fail differs
    from the manifest; ``actual_diff`` (rerun only) names outputs where the fresh run
    differs from the saved actual output."""

    folder: str
    case_id: str
    status: str  # pass | fail | error
    saved_status: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    reason: str = ""
    mode: str = "replay"  # replay | rerun
    sut: str = ""
    verify_level: str | None = None  # the saved run's (kernels on a5sim: tensor | lowered)
    saved_diff: list[str] = field(default_factory=list)
    actual_diff: list[str] | None = None  # None: not compared (plain replay)
    plots: list[str] = field(default_factory=list)  # error plots written (--plot)
    plot_notes: list[str] = field(default_factory=list)  # failing checks left undrawn

    @property
    def same_as_saved(self) -> bool:
        return self.saved_status == self.status and not self.saved_diff

    @property
    def ok(self) -> bool:
        """Passed, as saved, and (with --rerun) reproducing the saved actual output."""
        return self.status == "pass" and self.same_as_saved and not self.actual_diff


def _label(folder) -> str:
    """The case id a folder's manifest names when it is readable, else '?'."""
    try:
        cid = read_manifest(folder).get("case_id")
    except DataError:
        return "?"
    return cid if isinstance(cid, str) and cid else "?"


def replay_folder(folder, expect_wiring: str | None = None, rerun: bool = False,
                  plot_dir=None) -> ReplayResult:
    """Replay one saved case folder (its SUT too with ``rerun``); never raises for bad data.
    With ``plot_dir``, a failing case's error plots (of the output judged) are written there."""
    mode = "rerun" if rerun else "replay"
    try:
        case, manifest, tensors = load_case(folder, expect_wiring)
    except DataError as err:
        return ReplayResult(str(folder), _label(folder), "error", reason=str(err), mode=mode)
    res = ReplayResult(str(folder), case.case_id, "error", manifest["status"], mode=mode,
                       sut=manifest["sut_label"], verify_level=manifest["verify_level"])
    where = f"{folder}/{MANIFEST}"
    try:
        entry = registry.get(case.entry)
    except KeyError:
        res.reason = f"{where}: case.entry: {case.entry!r} is not a registered entry"
        return res
    try:
        validate_case(case, entry.support)
    except CaseError as err:
        res.reason = f"{where}: case: {err}"
        return res
    cfg = case.config
    inputs, golden, actual = tensors["inputs"], tensors["golden"], tensors["actual"]
    res.reason = integrity_problem(entry, case, inputs, golden)
    if res.reason:
        return res
    try:
        saved_verdicts = entry.compare(cfg, case, inputs, golden, actual)
    except (KeyError, ValueError) as err:
        res.reason = f"actual.safetensors: comparison impossible: {type(err).__name__}: {err}"
        return res
    res.reason = verdicts_problem(where, manifest["verdicts"], saved_verdicts)
    if res.reason:
        return res
    res.saved_diff = passed_differences(manifest["verdicts"], saved_verdicts)
    verdicts = saved_verdicts
    if rerun:
        label, fresh, why = _rerun(entry, case, inputs)
        if fresh is None:
            res.reason = why
            return res
        try:
            verdicts = entry.compare(cfg, case, inputs, golden, fresh)
        except (KeyError, ValueError) as err:
            res.reason = f"--rerun: comparison impossible: {type(err).__name__}: {err}"
            return res
        res.actual_diff = output_differences(actual, fresh)
        res.saved_diff = passed_differences(manifest["verdicts"], verdicts)
        if label != res.sut:
            res.saved_diff.insert(0, f"sut: saved by {res.sut}, rerun with {label}")
    res.verdicts = verdicts
    res.status = "pass" if verdicts and all_passed(verdicts) else "fail"
    if plot_dir is not None and res.status == "fail":
        _plot(res, entry, case, inputs, golden, fresh if rerun else actual, plot_dir)
    return res


def _plot(res: ReplayResult, entry, case, inputs, golden, actual, plot_dir) -> None:
    """Error plots of the judged output into ``plot_dir`` (see harness.plots.errors)."""
    from harness.plots import PlotError
    from harness.plots.errors import plot_failures
    try:
        drawn = plot_failures(entry, case, inputs, golden, actual, plot_dir, res.verdicts)
    except PlotError as err:
        res.plot_notes.append(f"no plot: {err}")
        return
    res.plots = [str(p) for p in drawn.paths]
    res.plot_notes = drawn.notes


def _rerun(entry, case, inputs):
    """(SUT label, its fresh outputs on copies of the saved inputs, '') or (label, None, why)."""
    label, sut = entry.sut_for(case.platform)
    if sut is None:
        return label, None, f"--rerun: no system under test for {case.entry} on {case.platform}"
    platform = load_platform(case.platform) if label.startswith("kernel:") else None
    try:
        if platform is not None:
            ok, why = platform.available()
            if not ok:
                return label, None, f"--rerun impossible: {why}"
        return label, sut(platform, case.config, case, clone_tensors(inputs)).outputs, ""
    except Exception as err:  # noqa: BLE001 - a SUT crash is this case's error
        return label, None, (f"--rerun: {label} raised {type(err).__name__}: {err}\n"
                             f"{traceback.format_exc(limit=3)}")
    finally:
        if platform is not None:
            platform.close()


def _close(saved: float, current: float, rel: float) -> bool:
    """Equal within ``rel`` relative (reduction order), NaN == NaN, inf == inf."""
    if math.isnan(saved) or math.isnan(current):
        return math.isnan(saved) and math.isnan(current)
    return saved == current or math.isclose(saved, current, rel_tol=rel, abs_tol=1e-30)


def verdicts_problem(where: str, saved: list[dict], current: list[Verdict]) -> str:
    """Where the manifest's verdict list departs from the one the entry computes now on
    the saved tensors, or ''.  Checked in order: the list's length, then per verdict its
    output and check names, relation, worst row, bound (1e-6 relative) and measured value
    (1e-5 relative).  A bound is the worst row's, so the row is checked before it."""
    if len(saved) != len(current):
        return (f"{where}: verdicts: {len(saved)} saved, the entry computes {len(current)} "
                f"({', '.join(f'{v.output}.{v.check}' for v in current)})")
    for i, (s, v) in enumerate(zip(saved, current)):
        name = f"{where}: verdicts[{i}]"
        for key, now in (("output", v.output), ("check", v.check), ("relation", v.relation),
                         ("row", str(v.row))):
            if s[key] != now:
                return (f"{name}.{key}: saved {s[key]!r}, the entry's current one is {now!r}"
                        + (" on the saved tensors" if key == "row" else ""))
        if not _close(float(s["bound"]), v.bound, 1e-6):
            return (f"{name}.bound: saved {s['bound']!r} for {v.output}.{v.check}, the entry's "
                    f"current bound is {v.bound!r}")
        if not _close(float(s["measured"]), v.measured, 1e-5):
            return (f"{name}.measured: saved {s['measured']!r} for {v.output}.{v.check}, the "
                    f"saved tensors give {v.measured!r}")
    return ""


def passed_differences(saved: list[dict], current: list[Verdict]) -> list[str]:
    """One line per verdict whose pass/fail differs from the manifest's (same list shape)."""
    word = {True: "pass", False: "fail"}
    return [f"verdicts[{i}] {v.output}.{v.check}: saved {word[s['passed']]}, now "
            f"{word[v.passed]}" for i, (s, v) in enumerate(zip(saved, current))
            if s["passed"] != v.passed]


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element mask where ``a`` and ``b`` (same shape and dtype) differ: exact for integer
    and 8-bit storage; floats beyond FP32 reassociation noise (1e-6 of max|b|), NaN
    placement exact."""
    if a.numel() == 0:
        return torch.zeros(a.shape, dtype=torch.bool)
    if a.element_size() == 1:
        return a.view(torch.uint8) != b.view(torch.uint8)
    if not a.is_floating_point():
        return a != b
    x, y = a.double(), b.double()
    nan = torch.isnan(x) != torch.isnan(y)
    x, y = x.nan_to_num(), y.nan_to_num()
    return nan | ((x - y).abs() > 1e-6 * y.abs().amax() + 1e-30)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and values (see :func:`_mismatch`)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return not bool(_mismatch(a, b).any())


def output_differences(saved: dict, fresh: dict) -> list[str]:
    """One line per output where the rerun differs from the saved actual output: missing
    on either side, shape/dtype, or how many elements differ and the first of them."""
    lines = []
    for name in sorted(set(saved) | set(fresh)):
        if name not in fresh:
            lines.append(f"{name}: saved, not produced by the rerun")
            continue
        if name not in saved:
            lines.append(f"{name}: produced by the rerun, absent from actual.safetensors")
            continue
        a, b = fresh[name], saved[name]
        if a.shape != b.shape or a.dtype != b.dtype:
            lines.append(f"{name}: rerun {a.dtype}{tuple(a.shape)}, "
                         f"saved {b.dtype}{tuple(b.shape)}")
            continue
        bad = _mismatch(a, b)
        n = int(bad.sum())
        if n:
            first = tuple(int(i) for i in bad.nonzero()[0])
            lines.append(f"{name}: {n} of {bad.numel()} elements differ, first at {first}: "
                         f"rerun {a[first].item()!r}, saved {b[first].item()!r}")
    return lines


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


def replay_tree(tree, wiring: str | None = None, rerun: bool = False,
                plot: str | None = None) -> list[ReplayResult]:
    """Replay every case under ``tree``: a case folder, a wiring folder, or a data root
    (``wiring`` then replays ``<tree>/<wiring>`` only).  A tree or case saved for the
    other wiring is refused (see :func:`harness.data.case_folders`)."""
    return [replay_folder(folder, expect, rerun, _plot_dir(plot, folder, expect))
            for folder, expect in case_folders(tree, wiring)]


def _plot_dir(plot: str | None, folder, wiring: str | None):
    """Where a case's plots go: None (no --plot), ``<folder>/plots`` (--plot without a
    folder) or ``<OUTDIR>/<wiring>/<case folder name>``."""
    from pathlib import Path

    from harness.plots.errors import PLOTS_DIR
    if plot is None:
        return None
    if plot == "":
        return Path(folder) / PLOTS_DIR
    return Path(plot) / (wiring or Path(folder).parent.name) / Path(folder).name


def print_replay(results: list[ReplayResult], console=None) -> None:
    """The replay table (mode in the title, SUT, verify level, saved and replayed status,
    worst check, the rerun's comparison with the saved actual, first note), every note in
    full below it, and a closing count line naming the mode."""
    from rich.console import Console
    from rich.table import Table

    from harness.report import STYLE, margin_text, worst_check
    con = console or (Console() if Console().is_terminal else Console(width=220))
    mode = results[0].mode if results else "replay"
    t = Table(title=f"V4.1 replay -- mode: {mode} ({MODES[mode]})")
    for col in ("case", "sut", "verify level", "saved", "replayed", "worst check", "of bound",
                "vs saved actual", "note"):
        t.add_column(col, overflow="fold")
    for r in results:
        w = worst_check(r.verdicts)
        vs = ("-" if r.actual_diff is None else
              "identical" if not r.actual_diff else f"[bold red]{len(r.actual_diff)} differ[/]")
        notes = _notes(r)
        t.add_row(r.case_id, r.sut or "-", r.verify_level or "-", str(r.saved_status),
                  f"[{STYLE.get(r.status, '')}]{r.status}[/]",
                  f"{w.output}.{w.check}" if w else "-", margin_text(w) if w else "-", vs,
                  notes[0] if notes else "")
    con.print(t)
    for r in results:
        if _notes(r):
            con.print(f"{r.case_id} ({r.folder}):", highlight=False, markup=False)
            for line in _notes(r):
                con.print(f"  {line}", highlight=False, markup=False)
    for r in results:
        for line in [f"plot: {p}" for p in r.plots] + r.plot_notes:
            con.print(f"{r.case_id}: {line}", highlight=False, markup=False, soft_wrap=True)
    bad = sum(1 for r in results if not r.ok)
    con.print(f"{len(results) - bad} passed, {bad} failed (mode: {mode})", highlight=False)


def _notes(r: ReplayResult) -> list[str]:
    lines = [r.reason.splitlines()[0]] if r.reason else []
    if r.saved_status != r.status and r.status != "error":
        lines.append(f"status: saved {r.saved_status}, now {r.status}")
    lines += r.saved_diff
    lines += [f"rerun vs saved actual: {d}" for d in r.actual_diff or ()]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.replay",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("tree", help="out/data, out/data/<wiring> or one case folder")
    ap.add_argument("--wiring", choices=("replicated", "sharded"), default=None,
                    help="on a data root: replay <tree>/<wiring> only; on a wiring or case "
                         "folder: refuse one saved for the other wiring")
    ap.add_argument("--rerun", action="store_true",
                    help="run the system under test again and compare its output with the "
                         "golden and with the saved actual output")
    ap.add_argument("--plot", nargs="?", const="", default=None, metavar="OUTDIR",
                    help="error plots of every failing case: into <case>/plots/, or "
                         "OUTDIR/<wiring>/<case>/ when OUTDIR is given (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.plot is not None:
        from harness.plots import PlotError, require_matplotlib
        try:
            require_matplotlib()
        except PlotError as err:
            print(f"replay refused: {err}", file=sys.stderr)
            return 2
    try:
        results = replay_tree(args.tree, args.wiring, args.rerun, args.plot)
    except DataError as err:
        print(f"replay refused: {err}", file=sys.stderr)
        return 1
    print_replay(results)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
