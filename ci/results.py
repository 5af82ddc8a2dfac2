"""Verdicts, TSV/JSON result files and the rich summary of a queue run.

A pytest node passes only if its process exited 0 *and* its log ends with a pytest summary
line reporting at least one passed test and no failures or errors ("no false greens"). A node
whose summary shows only skips (or xfails) and exit 0 is ``skip``: not a failure, not a pass.
Anything else -- exit 5 / "no tests ran", exit 0 without a summary line, a collection error,
a node that needs more cards than the pool -- is ``fail``; an expired node is ``timeout``; a
node left unfinished by a cancelled run (SIGINT/SIGTERM to the runner) is ``cancelled``.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

STATUSES = ("pass", "skip", "fail", "timeout", "cancelled")
_LINE = re.compile(r"^=*\s*(?P<body>.+?) in \d+(?:\.\d+)?s(?: \([\d:.]+\))?\s*=*\s*$")
_BODY = re.compile(r"(?:\d+ [a-z]+)(?:, \d+ [a-z]+)*|no tests ran")
_ITEM = re.compile(r"(\d+) ([a-z]+)")
COLUMNS = ("node", "cards", "devices", "queued", "seconds", "status", "pass", "fail", "timeout",
           "rc", "log", "note")


def parse_summary(text: str) -> dict[str, int] | None:
    """Counts from the last pytest summary line (``1 failed, 2 passed in 0.3s``), or None."""
    for line in reversed(text.splitlines()):
        m = _LINE.match(line.strip())
        if m and _BODY.fullmatch(m["body"]):
            counts: dict[str, int] = {}
            for n, word in _ITEM.findall(m["body"]):
                word = {"error": "errors", "warning": "warnings"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(n)
            return counts
    return None


def classify(rc: int | None, text: str, timed_out: bool, kind: str = "pytest") -> dict:
    """Status plus pass/fail counts for one finished node."""
    if timed_out:
        return {"status": "timeout", "pass": 0, "fail": 0, "note": ""}
    if kind == "cli":   # sweep entry mains raise SystemExit(error) on any miss
        ok = rc == 0
        return {"status": "pass" if ok else "fail", "pass": int(ok), "fail": int(not ok),
                "note": "" if ok else f"exit {rc}"}
    counts = parse_summary(text)
    if counts is None:
        return {"status": "fail", "pass": 0, "fail": 0,
                "note": f"exit {rc} without a pytest summary line"}
    passed = counts.get("passed", 0)
    failed = counts.get("failed", 0) + counts.get("errors", 0)
    quiet = counts.get("skipped", 0) + counts.get("xfailed", 0) + counts.get("xpassed", 0)
    if rc == 0 and failed == 0 and passed >= 1:
        status, note = "pass", ""
    elif rc == 0 and failed == 0 and quiet >= 1:
        status, note = "skip", "skipped only"
    else:
        status, note = "fail", ("no tests ran" if rc == 5 or not (passed or failed or quiet)
                                else f"exit {rc}")
    return {"status": status, "pass": passed, "fail": failed, "note": note}


def row(node: str, cards: int, devices, seconds: float, verdict: dict, rc, log,
        queued: float = 0.0) -> dict:
    """One result row; ``seconds`` is run time only, ``queued`` the wait before the start."""
    return {"node": node, "cards": cards,
            "devices": ",".join(map(str, devices)) if devices else "",
            "queued": round(queued, 2), "seconds": round(seconds, 2), "status": verdict["status"],
            "pass": verdict["pass"], "fail": verdict["fail"],
            "timeout": int(verdict["status"] == "timeout"), "rc": rc,
            "log": str(log) if log else "", "note": verdict.get("note", "")}


def exit_status(rows: list[dict]) -> int:
    """1 if nothing ran, nothing passed, or any node failed, timed out or was cancelled."""
    if not rows or not any(r["status"] == "pass" for r in rows):
        return 1
    return int(any(r["status"] in ("fail", "timeout", "cancelled") for r in rows))


def write(rows: list[dict], out: Path, meta: dict) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    tsv, js = out / "results.tsv", out / "results.json"
    with open(tsv, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    totals = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    js.write_text(json.dumps({**meta, "totals": totals, "exit": exit_status(rows),
                              "nodes": rows}, indent=1) + "\n")
    return tsv, js


_STYLE = {"pass": "green", "skip": "yellow", "fail": "bold red", "timeout": "bold magenta",
          "cancelled": "bold yellow"}


def summary(rows: list[dict], console: Console | None = None, title: str = "CI queue") -> None:
    console = console or Console()
    table = Table(title=title)
    for col in ("node", "cards", "devices", "queued", "seconds", "status", "note / log"):
        table.add_column(col, justify="right" if col in ("cards", "queued", "seconds") else "left",
                         overflow="fold")
    for r in sorted(rows, key=lambda r: (STATUSES.index(r["status"]), r["node"])):
        extra = r["note"] + ("\n" + r["log"] if r["status"] != "pass" and r["log"] else "")
        table.add_row(escape(r["node"]), str(r["cards"]), r["devices"],
                      f'{r.get("queued", 0.0):.1f}', f'{r["seconds"]:.1f}',
                      f'[{_STYLE[r["status"]]}]{r["status"]}[/]', escape(extra))
    console.print(table)
    totals = ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in STATUSES)
    verdict = "[bold red]FAILED[/]" if exit_status(rows) else "[bold green]OK[/]"
    why = " (no node collected)" if not rows else (
        " (no node passed)" if not any(r["status"] == "pass" for r in rows) else "")
    console.print(f"{verdict} {len(rows)} node(s): {totals}{why}")
