"""The run report and the JSON summary file.

A run prints one short line per case (entry, the axes that differ from the defaults, SUT
kind, verdict, the worst check among those that measured a value with its margin, the
estimated A5 time and the verify level), then the failing checks (every check with
``verbose``), the skipped cases with their reasons, one summary row per entry, and the
closing counts with kernel and golden-alt results apart.  A check that measured nothing
(:attr:`~harness.verdict.Verdict.applicable` False) is never shown as the worst check.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.case import Case

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "error": "bold magenta"}
SUT_KINDS = ("kernel", "golden-alt")
STATUSES = ("pass", "fail", "skip", "error")
WIDTH = 120  # columns of a report written to a file or pipe
_DEFAULT = Case(entry="")


def _console(console: Console | None) -> Console:
    if console is not None:
        return console
    con = Console()
    return con if con.is_terminal else Console(width=WIDTH)


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


def worst_check(verdicts):
    """The most critical verdict that measured a value (see :func:`_tightness`); None when
    no verdict measured anything."""
    return min((v for v in verdicts if v.applicable), key=_tightness, default=None)


def axes_text(case: Case) -> str:
    """tp and tokens always, the other axes only where they differ from the defaults."""
    parts = [f"tp{case.tp}"]
    if case.dp != _DEFAULT.dp:
        parts.append(f"dp{case.dp}")
    if case.ep is not None:
        parts.append(f"ep{case.ep}")
    act = f"a{case.active_tokens}" if case.active_tokens is not None else ""
    if case.dp_tokens is not None:
        act += " dp-tokens " + ",".join(map(str, case.dp_tokens))
    parts.append(f"t{case.tokens}{act}")
    for name, prefix in (("requests", "r"), ("epochs", "e"), ("seed", "s")):
        if getattr(case, name) != getattr(_DEFAULT, name):
            parts.append(f"{prefix}{getattr(case, name)}")
    parts += [getattr(case, name) for name in ("wiring", "kind", "preset")
              if getattr(case, name) != getattr(_DEFAULT, name)]
    return " ".join(parts)


def margin_text(v) -> str:
    """How much of its bound ``v`` used: ``measured / bound`` as a percentage for ``<=``
    checks (over 100 % fails), the signed margin for ``>=`` checks; ``exact`` for a passing
    check with bound 0."""
    if v.passed and v.bound == 0:
        return "exact"
    if v.relation in ("<=", "<") and v.bound > 0 and math.isfinite(v.measured):
        return f"{100 * v.measured / v.bound:.3g}%"
    return f"{v.margin:+.2g}"


def verify_text(result) -> str:
    level = getattr(result, "verify_level", None)  # engineer A's CaseResult field
    return "-" if level is None else str(level)


def case_table(results) -> Table:
    """One row per case."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
              collapse_padding=True, title="V4.1 validation")
    for col in ("entry", "axes", "sut", "verdict", "worst check", "of bound", "A5 us", "verify"):
        t.add_column(col, no_wrap=True, overflow="ellipsis",
                     justify="right" if col in ("of bound", "A5 us") else "left")
    for r in results:
        w = worst_check(r.verdicts)
        est = r.estimated_a5_us()
        check = f"{w.output}.{w.check}" if w else ("n/a" if r.verdicts else "-")
        t.add_row(r.case.entry, axes_text(r.case), r.sut_kind,
                  f"[{STYLE.get(r.status, '')}]{r.status}[/]", check,
                  margin_text(w) if w else "-", f"{est:.1f}" if est is not None else "-",
                  verify_text(r))
    return t


def counts(results) -> dict[str, int]:
    c = dict.fromkeys(STATUSES, 0)
    for r in results:
        c[r.status] += 1
    return c


def counts_by_sut(results) -> dict[str, dict[str, int]]:
    """Status counts per SUT kind: always ``kernel`` and ``golden-alt``, ``none`` (no
    system under test on the platform) only when present."""
    kinds = list(SUT_KINDS) + sorted({r.sut_kind for r in results} - set(SUT_KINDS))
    return {k: counts([r for r in results if r.sut_kind == k]) for k in kinds}


def entry_table(results) -> Table:
    """One summary row per (entry, SUT kind)."""
    groups = defaultdict(list)
    for r in results:
        groups[(r.case.entry, r.sut_kind)].append(r)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title="per entry")
    for col in ("entry", "sut", "cases", "pass", "fail", "skip", "error", "max A5 us"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("entry", "sut") else "right")
    for (entry, kind), rs in sorted(groups.items()):
        c = counts(rs)
        est = [e for e in (r.estimated_a5_us() for r in rs) if e is not None]
        t.add_row(entry, kind, str(len(rs)), *(str(c[s]) for s in STATUSES),
                  f"{max(est):.1f}" if est else "-")
    return t


def closing_line(results) -> str:
    """``kernel: P passed, F failed, S skipped | golden-alt: ...`` (errors count as failed)."""
    parts = [f"{kind}: {c['pass']} passed, {c['fail'] + c['error']} failed, {c['skip']} skipped"
             for kind, c in counts_by_sut(results).items()]
    return " | ".join(parts)


def print_run(results, console: Console | None = None, verbose: bool = False) -> None:
    """The report of a run (see the module docstring)."""
    con = _console(console)
    con.print(case_table(results))
    for r in results:
        if verbose and r.verdicts:
            con.print(f"{r.case.case_id}: {r.status}", highlight=False, markup=False,
                      soft_wrap=True)
            for v in r.verdicts:
                con.print(v.line(), style=STYLE["fail"] if not v.passed else None,
                          highlight=False, markup=False, soft_wrap=True)
        elif r.status in ("fail", "error"):
            con.print(r.failure_text(), style=STYLE[r.status], highlight=False, markup=False,
                      soft_wrap=True)
    for r in results:
        if r.status == "skip":
            con.print(f"skipped: {r.failure_text()}", highlight=False, markup=False, soft_wrap=True)
    con.print(entry_table(results))
    con.print(closing_line(results), highlight=False)


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x


def summary_json(results) -> dict:
    """Counts (overall and per SUT kind) and every case with its verdicts; a verdict that
    measured nothing has ``applicable`` false and null ``measured``/``margin``."""
    return {
        "counts": counts(results),
        "counts_by_sut": counts_by_sut(results),
        "cases": [{
            "case_id": r.case.case_id, "entry": r.case.entry, "wiring": r.case.wiring,
            "platform": r.case.platform, "sut": r.sut, "sut_kind": r.sut_kind,
            "status": r.status, "reason": r.reason, "verify_level": getattr(r, "verify_level", None),
            "seconds": round(r.seconds, 3), "estimated_a5_us": r.estimated_a5_us(),
            "costs": r.costs, "data_dir": r.data_dir,
            "verdicts": [{"output": v.output, "check": v.check, "passed": v.passed,
                          "applicable": v.applicable, "row": str(v.row),
                          "measured": _number(v.measured), "bound": v.bound,
                          "margin": _number(v.margin), "n_failing": v.n_failing,
                          "n_checked": v.n_checked} for v in r.verdicts],
        } for r in results],
    }


def write_summary(results, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary_json(results), indent=2, default=str))
    return path
