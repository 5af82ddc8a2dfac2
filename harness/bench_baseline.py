"""The estimate baseline of ``python -m harness.bench``: ``--save-baseline FILE``, ``--check FILE``
and the ``--gate`` case set.

A baseline is a JSON file holding the selection it was made with (preset, tokens, gate) and
one record per case id (entry, case, preset, tokens, tp, estimated_us, total_cycles, the
simulated topology, the pypto version), ordered by case id, indented so a refresh diffs case by
case.  The cost model is deterministic, so a check compares the figures directly:

* a case whose estimate is more than :data:`TOLERANCE` above its baseline is a regression
  and fails; one more than :data:`TOLERANCE` below is listed as an improvement (refresh the
  baseline), not a failure;
* a baseline case the run does not produce is ``missing`` and fails; a run case without a
  baseline record is ``new, no baseline`` and does not fail; a case without an estimate fails;
* a baseline made on another simulated topology (cube/vector cores, clock) or pypto version
  is refused before any case runs: its figures are not comparable.

``--gate`` is the CI case set: the first TINY case of the default matrix of every building-block
kernel entry and of one decode composition per attention family (:data:`GATE_COMPOSITIONS`);
with entry names, the first TINY case of each named entry.
Nothing here imports pypto.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from harness.bench import bench_cases
from harness.case import Case

FORMAT = "v41-bench-baseline/1"
TOLERANCE = 0.05  # a case more than 5 % slower than its baseline fails
GATE_PRESET = "tiny"
# Attention leaves and compositions (entry names starting with COMPOSITION_PREFIXES: a
# launch sequence per rank) take 40-200 s each at TINY, a building block 3-16 s: the CI set
# keeps one decode composition per attention family; every kernel they launch is gated too.
COMPOSITION_PREFIXES = ("decode_", "prefill_")
GATE_COMPOSITIONS = ("decode_swa", "decode_c1a_reindex", "decode_c2a_full")
SAVABLE = ("pass", "estimate")  # run statuses whose estimate may become a baseline
# the topology keys that make two estimates comparable ("mismatches" is descriptive text)
TOPOLOGY_KEYS = ("cube_cores", "vector_cores", "clock_mhz")
RECORD_KEYS = ("entry", "case", "preset", "tokens", "tp", "estimated_us", "total_cycles",
               "topology", "pypto")


class BaselineError(ValueError):
    """A baseline file that cannot be read or whose content is malformed (names the field)."""


def pypto_version() -> str:
    """The installed pypto version (read from package metadata, pypto is not imported)."""
    from harness.data import package_versions
    return package_versions()["pypto"]


def gate_cases(names: list[str]) -> list[Case]:
    """The first TINY case of each kernel entry in ``names``; without names the CI set: every
    building-block kernel entry and, of the attention leaves and compositions, only
    GATE_COMPOSITIONS."""
    first: dict[str, Case] = {}
    for case in bench_cases(names, GATE_PRESET, None):
        first.setdefault(case.entry, case)
    if names:
        return list(first.values())
    return [c for n, c in first.items()
            if not n.startswith(COMPOSITION_PREFIXES) or n in GATE_COMPOSITIONS]


def selection(preset: str | None, tokens: list[int] | None, gate: bool) -> dict:
    """The case-selection flags a baseline records (entries narrow a check, see check_rows)."""
    return {"gate": gate, "preset": GATE_PRESET if gate else preset,
            "tokens": sorted(tokens) if tokens else None}


def refuse_gate_flags(gate: bool, preset: str | None, tokens: list[int] | None) -> str | None:
    """The message when ``--gate`` is combined with a preset or tokens it would override."""
    if gate and preset not in (None, GATE_PRESET):
        return f"bench: --gate runs the {GATE_PRESET.upper()} cases; --preset {preset} conflicts"
    if gate and tokens:
        return "bench: --gate runs each entry's first TINY matrix case; --tokens conflicts"
    return None


def check_save_path(path: str) -> str | None:
    """The message when ``--save-baseline path`` cannot be written (checked before any run)."""
    p = Path(path)
    if p.is_dir():
        return f"bench: --save-baseline {path}: is a directory"
    if not p.parent.is_dir():
        return f"bench: --save-baseline {path}: directory {str(p.parent)!r} does not exist"
    if not os.access(p.parent, os.W_OK):
        return f"bench: --save-baseline {path}: directory {str(p.parent)!r} is not writable"
    return None


def record(row: dict, pypto: str) -> dict:
    """One baseline record from a bench JSON row (``harness.bench.bench_row``)."""
    topo = {k: row["topology"][k] for k in (*TOPOLOGY_KEYS, "mismatches")}
    return {"entry": row["entry"], "case": row["case"], "preset": row["preset"],
            "tokens": row["tokens"], "tp": row["tp"], "estimated_us": row["estimated_us"],
            "total_cycles": row["total_cycles"], "topology": topo, "pypto": pypto}


def dumps(sel: dict, records: list[dict]) -> str:
    """The file text: records ordered by case id, fixed key order, two-space indent."""
    doc = {"format": FORMAT, "selection": sel,
           "cases": sorted(records, key=lambda r: r["case"])}
    return json.dumps(doc, indent=2) + "\n"


def save_baseline(path: str, rows: list[dict], sel: dict, pypto: str) -> str | None:
    """Write the baseline of ``rows`` to ``path`` (atomically); the refusal message instead
    when a row did not pass (or estimate) or has no estimate (nothing is written then)."""
    holes = [f"{r['case']} ({r['status']})" for r in rows
             if r["status"] not in SAVABLE or not _positive(r["estimated_us"])]
    if holes:
        return (f"bench: --save-baseline {path}: not written, no passing estimate for "
                f"{', '.join(holes)}")
    text = dumps(sel, [record(r, pypto) for r in rows])
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return None


# ---- reading and validating --------------------------------------------------------------

def _positive(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x > 0)


def _count(x, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _need(ok: bool, field: str, what: str, got) -> None:
    if not ok:
        raise BaselineError(f"{field}: expected {what}, got {got!r}")


def _check_record(i: int, rec, seen: set[str]) -> None:
    at = f"cases[{i}]"
    _need(isinstance(rec, dict), at, "an object", rec)
    for key in RECORD_KEYS:
        if key not in rec:
            raise BaselineError(f"{at}.{key}: missing")
    _need(isinstance(rec["entry"], str) and rec["entry"] != "", f"{at}.entry",
          "an entry name", rec["entry"])
    _need(isinstance(rec["case"], str) and rec["case"].startswith(rec["entry"] + "-"),
          f"{at}.case", f"a case id of entry {rec['entry']!r}", rec["case"])
    if rec["case"] in seen:
        raise BaselineError(f"{at}.case: duplicate case id {rec['case']!r}")
    seen.add(rec["case"])
    _need(rec["preset"] in ("tiny", "flash"), f"{at}.preset", "'tiny' or 'flash'", rec["preset"])
    _need(_count(rec["tokens"], 1), f"{at}.tokens", "an integer >= 1", rec["tokens"])
    _need(_count(rec["tp"], 1), f"{at}.tp", "an integer >= 1", rec["tp"])
    _need(_positive(rec["estimated_us"]), f"{at}.estimated_us", "a finite number > 0",
          rec["estimated_us"])
    _need(rec["total_cycles"] is None or _count(rec["total_cycles"], 0), f"{at}.total_cycles",
          "an integer >= 0 or null", rec["total_cycles"])
    topo = rec["topology"]
    _need(isinstance(topo, dict), f"{at}.topology", "an object", topo)
    for key in TOPOLOGY_KEYS:
        _need(_count(topo.get(key), 1), f"{at}.topology.{key}", "an integer >= 1",
              topo.get(key))
    _need(isinstance(rec["pypto"], str) and rec["pypto"] != "", f"{at}.pypto",
          "a version string", rec["pypto"])


def load_baseline(path: str) -> dict:
    """The validated baseline document at ``path``; BaselineError names the file and the
    first malformed field (``format``, ``selection.gate``, ``cases[2].estimated_us``, ...)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise BaselineError(f"--check {path}: cannot read: {err.strerror or err}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise BaselineError(f"--check {path}: not JSON: {err}") from None
    try:
        _need(isinstance(doc, dict), "(top level)", "an object", type(doc).__name__)
        _need(doc.get("format") == FORMAT, "format", repr(FORMAT), doc.get("format"))
        sel = doc.get("selection")
        _need(isinstance(sel, dict), "selection", "an object", sel)
        _need(isinstance(sel.get("gate"), bool), "selection.gate", "true or false",
              sel.get("gate"))
        _need(sel.get("preset") in (None, "tiny", "flash"), "selection.preset",
              "'tiny', 'flash' or null", sel.get("preset"))
        tok = sel.get("tokens")
        _need(tok is None or (isinstance(tok, list) and all(_count(t, 1) for t in tok)),
              "selection.tokens", "null or a list of integers >= 1", tok)
        cases = doc.get("cases")
        _need(isinstance(cases, list) and cases, "cases", "a non-empty list", cases)
        seen: set[str] = set()
        for i, rec in enumerate(cases):
            _check_record(i, rec, seen)
    except BaselineError as err:
        raise BaselineError(f"--check {path}: {err}") from None
    return doc


def comparable(doc: dict, sel: dict, topo: dict, pypto: str) -> str | None:
    """None when this run can be judged against ``doc``, else why not: another case
    selection, simulated topology or pypto version (checked before any case runs)."""
    if doc["selection"] != sel:
        return (f"bench: --check: this run selects {sel}, the baseline was made with "
                f"{doc['selection']}: use the baseline's --gate/--preset/--tokens")
    ours = {k: topo[k] for k in TOPOLOGY_KEYS}
    for rec in doc["cases"]:
        theirs = {k: rec["topology"][k] for k in TOPOLOGY_KEYS}
        if theirs != ours:
            return (f"bench: --check: topology mismatch: baseline case {rec['case']} was "
                    f"estimated on {theirs}, this run simulates {ours}; the figures are not "
                    f"comparable, regenerate the baseline with --save-baseline")
        if rec["pypto"] != pypto:
            return (f"bench: --check: pypto version mismatch: baseline case {rec['case']} was "
                    f"estimated with pypto {rec['pypto']}, this run has pypto {pypto}; the "
                    f"figures are not comparable, regenerate the baseline with --save-baseline")
    return None


# ---- checking ----------------------------------------------------------------------------

REGRESSION, OK, IMPROVED, NEW, MISSING, NO_ESTIMATE = (
    "REGRESSION", "ok", "improved", "new, no baseline", "missing", "no estimate")
FAILING = (REGRESSION, MISSING, NO_ESTIMATE)


@dataclass(frozen=True)
class Line:
    """One case of a check: baseline and run estimates (None where absent) and the verdict."""

    case: str
    entry: str
    old_us: float | None
    new_us: float | None
    verdict: str

    @property
    def ratio(self) -> float | None:
        return self.new_us / self.old_us if self.old_us and self.new_us is not None else None


def judge(old: float | None, new: float | None) -> str:
    """The verdict of one estimate against its baseline (``old`` None: no baseline)."""
    if new is None:
        return NO_ESTIMATE
    if old is None:
        return NEW
    if new > old * (1 + TOLERANCE):
        return REGRESSION
    return IMPROVED if new < old * (1 - TOLERANCE) else OK


def check_rows(doc: dict, rows: list[dict], entries: list[str]) -> list[Line]:
    """Every run row against the baseline, then the baseline cases the run lacks.  Named
    ``entries`` narrow the check to those entries' baseline cases; without names every
    baseline case is expected (so a removed entry's cases are missing)."""
    base = {r["case"]: r for r in doc["cases"] if not entries or r["entry"] in entries}
    lines = []
    for row in rows:
        old = base.pop(row["case"], None)
        old_us = old["estimated_us"] if old else None
        lines.append(Line(row["case"], row["entry"], old_us, row["estimated_us"],
                          judge(old_us, row["estimated_us"])))
    lines += [Line(c, r["entry"], r["estimated_us"], None, MISSING) for c, r in base.items()]
    return lines


def failed(lines: list[Line]) -> bool:
    return any(line.verdict in FAILING for line in lines)


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(lines: list[Line], path: str, console) -> None:
    """The ratio table of every case, then each failing, new and improved case by name with
    old/new/ratio, then the verdict line."""
    from rich.table import Table

    table = Table(title=f"Estimate vs baseline {path} (fails above "
                        f"{1 + TOLERANCE:.2f}x)")
    for col in ("case", "baseline us", "this run us", "new/old", "verdict"):
        table.add_column(col)
    style = {REGRESSION: "bold red", MISSING: "bold red", NO_ESTIMATE: "bold red",
             IMPROVED: "green", NEW: "yellow"}
    for ln in lines:
        table.add_row(ln.case, _us(ln.old_us), _us(ln.new_us),
                      "-" if ln.ratio is None else f"{ln.ratio:.3f}x", ln.verdict,
                      style=style.get(ln.verdict))
    console.print(table)
    for ln in lines:
        if ln.verdict == REGRESSION:
            console.print(f"REGRESSION {ln.case}: {_us(ln.old_us)} -> {_us(ln.new_us)} us "
                          f"({ln.ratio:.3f}x, limit {1 + TOLERANCE:.2f}x)", highlight=False)
        elif ln.verdict == MISSING:
            console.print(f"MISSING {ln.case}: in the baseline, not produced by this run",
                          highlight=False)
        elif ln.verdict == NO_ESTIMATE:
            console.print(f"NO ESTIMATE {ln.case}: baseline {_us(ln.old_us)} us, this run "
                          f"gave none", highlight=False)
        elif ln.verdict == NEW:
            console.print(f"new, no baseline: {ln.case} ({_us(ln.new_us)} us)", highlight=False)
        elif ln.verdict == IMPROVED:
            console.print(f"improved {ln.case}: {_us(ln.old_us)} -> {_us(ln.new_us)} us "
                          f"({ln.ratio:.3f}x): refresh the baseline with --save-baseline",
                          highlight=False)
    bad = [ln for ln in lines if ln.verdict in FAILING]
    counts = ", ".join(f"{sum(ln.verdict == v for ln in lines)} {v}"
                       for v in (OK, REGRESSION, IMPROVED, NEW, MISSING, NO_ESTIMATE))
    console.print(f"baseline check {'FAILED' if bad else 'passed'}: {counts}", highlight=False)
