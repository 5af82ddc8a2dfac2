"""Rich reports of runs and replays, and the JSON summary file.

One table row per (case, output): the worst verdict of that output, its margin to the
bound, the estimated A5 time when the platform reports one, and the verdict.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "error": "bold magenta"}


def _console(console: Console | None) -> Console:
    if console is not None:
        return console
    con = Console()
    return con if con.is_terminal else Console(width=220)


def progress(console: Console | None = None) -> Progress:
    """A progress bar over a case matrix."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=_console(console), transient=False)


def _tightness(v) -> tuple:
    """Sort key: failing first, then the smallest margin relative to its bound; exact
    checks (bound 0) that pass are the least interesting."""
    if not v.passed:
        return (0, v.margin)
    if v.bound == 0:
        return (2, 0.0)
    return (1, v.margin / abs(v.bound))


def _worst_by_output(verdicts):
    groups = defaultdict(list)
    for v in verdicts:
        groups[v.output].append(v)
    return {out: min(vs, key=_tightness) for out, vs in groups.items()}


def run_table(results, title: str = "V4.1 validation") -> Table:
    t = Table(title=title, show_lines=False)
    for col in ("case", "wiring", "sut", "output", "worst check", "row", "measured",
                "bound", "margin", "est. A5 us", "verdict"):
        t.add_column(col, overflow="fold")
    for r in results:
        est = r.estimated_a5_us()
        est_s = f"{est:.1f}" if est is not None else "-"
        style = STYLE.get(r.status, "")
        if not r.verdicts:
            t.add_row(r.case.case_id, r.case.wiring, r.sut, "-", "-", "-", "-", "-", "-", est_s,
                      f"[{style}]{r.status}[/]: {r.reason.splitlines()[0] if r.reason else ''}")
            continue
        for out, v in _worst_by_output(r.verdicts).items():
            ok = "pass" if all(x.passed for x in r.verdicts if x.output == out) else "fail"
            t.add_row(r.case.case_id, r.case.wiring, r.sut, out, v.check, str(v.row),
                      f"{v.measured:.3g}", f"{v.relation} {v.bound:.3g}", f"{v.margin:.3g}",
                      est_s, f"[{STYLE[ok]}]{ok}[/]")
    return t


def counts(results) -> dict[str, int]:
    c = {"pass": 0, "fail": 0, "skip": 0, "error": 0}
    for r in results:
        c[r.status] += 1
    return c


def print_run(results, console: Console | None = None) -> None:
    con = _console(console)
    con.print(run_table(results))
    for r in results:
        if r.status in ("fail", "error"):
            con.print(f"[{STYLE[r.status]}]{r.failure_text()}[/]", markup=True, highlight=False)
    c = counts(results)
    # the plain closing line CI readers look for
    con.print(f"{c['pass']} passed, {c['fail'] + c['error']} failed, {c['skip']} skipped",
              highlight=False)


def summary_json(results) -> dict:
    return {
        "counts": counts(results),
        "cases": [{
            "case_id": r.case.case_id, "entry": r.case.entry, "wiring": r.case.wiring,
            "platform": r.case.platform, "sut": r.sut, "status": r.status, "reason": r.reason,
            "seconds": round(r.seconds, 3), "estimated_a5_us": r.estimated_a5_us(),
            "costs": r.costs, "data_dir": r.data_dir,
            "verdicts": [{"output": v.output, "check": v.check, "passed": v.passed,
                          "row": str(v.row), "measured": v.measured, "bound": v.bound,
                          "margin": v.margin, "n_failing": v.n_failing} for v in r.verdicts],
        } for r in results],
    }


def write_summary(results, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary_json(results), indent=2, default=str))
    return path


def print_replay(results, console: Console | None = None) -> None:
    con = _console(console)
    t = Table(title="V4.1 replay")
    for col in ("case", "saved", "replayed", "worst check", "margin", "note"):
        t.add_column(col, overflow="fold")
    for r in results:
        w = min(r.verdicts, key=lambda v: v.margin) if r.verdicts else None
        note = r.reason or ("" if r.same_as_saved else "verdict differs from the saved one")
        t.add_row(r.case_id, str(r.saved_status), f"[{STYLE.get(r.status, '')}]{r.status}[/]",
                  f"{w.output}.{w.check}" if w else "-", f"{w.margin:.3g}" if w else "-", note)
    con.print(t)
    bad = sum(1 for r in results if r.status != "pass" or not r.same_as_saved)
    con.print(f"{len(results) - bad} passed, {bad} failed", highlight=False)
