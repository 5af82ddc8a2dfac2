"""Verdicts: what every comparator returns instead of a bool.

A :class:`Verdict` states one check on one output: which metric (``check``), which row
was worst, the measured value, the bound it was held to, and the margin left
(negative when failing).  A comparator gathers every row first and returns one verdict
per check; the verdict names the worst row and carries *all* failing rows in
``failing_rows``, so no failure is dropped.  Reports, replay and pytest assertions all
read these objects; :func:`format_failures` renders them in one fixed line format.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

RowLabel = int | tuple[int, ...] | None

# relation -> predicate(measured, bound); NaN compares False, so NaN always fails
_RELATIONS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge}
_SHOWN_ROWS = 5  # failing rows quoted in ``detail``; the field holds all of them


@dataclass(frozen=True)
class Verdict:
    """One check on one output.

    ``margin`` is ``bound - measured`` for ``<=``/``<`` checks and ``measured - bound``
    for ``>=`` checks; it is ``-inf`` when the measured value is NaN.  ``row`` is the
    worst row (index, tuple over leading dims, or None for a global metric);
    ``failing_rows`` lists every failing row, ``n_failing`` of ``n_checked`` rows.
    ``metric`` is the formula checked, ``note`` extra context (first changed index, ...),
    ``detail`` the one-sentence summary of all of it.  A check over no rows measured
    nothing: it is not :attr:`applicable` (``measured`` and ``margin`` are NaN); it does
    not fail the case, and reports show it as "n/a", never as a pass.
    """

    output: str
    check: str
    passed: bool
    row: RowLabel
    measured: float
    bound: float
    margin: float
    detail: str
    relation: str = "<="
    failing_rows: tuple = ()
    n_failing: int = 0
    n_checked: int = 0
    metric: str = ""
    note: str = ""

    @property
    def applicable(self) -> bool:
        """False when the check had nothing to measure (no rows, no elements); a failing
        verdict is always applicable."""
        return self.n_checked > 0 or not self.passed

    def line(self) -> str:
        """The fixed one-line rendering: status, output, check, row, measured, bound."""
        if not self.applicable:
            return f"N/A {self.output} {self.check}: no rows to check [{self.metric}]"
        status = "PASS" if self.passed else "FAIL"
        tail = self.metric + (f"; {self.note}" if self.note else "")
        return (
            f"{status} {self.output} {self.check} row={self.row} measured={self.measured:.6g} "
            f"bound={self.relation}{self.bound:.6g} failing_rows={self.n_failing}/{self.n_checked} [{tail}]"
        )


def _margins(measured: np.ndarray, bound: np.ndarray, relation: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        m = measured - bound if relation == ">=" else bound - measured
    return np.where(np.isnan(m), -np.inf, m)


def _sentence(what: str, row: RowLabel, m: float, b: float, relation: str, ok: bool) -> str:
    shown = relation if ok else f"violates {relation}"
    return f"{what} at row {row}: {m:.6g} {shown} {b:.6g}"


def summarize(
    output: str,
    check: str,
    measured,
    bound,
    labels: Sequence[RowLabel],
    *,
    metric: str = "",
    relation: str = "<=",
) -> Verdict:
    """One verdict from per-row ``measured`` values and a scalar or per-row ``bound``.

    Every row is judged; the verdict names the row with the smallest margin and lists
    all failing rows.  No rows at all measures nothing: a verdict that is not
    :attr:`~Verdict.applicable` (``row=None``, ``measured`` and ``margin`` NaN).
    """
    if relation not in _RELATIONS:
        raise ValueError(f"{output}: relation {relation!r} is not one of {sorted(_RELATIONS)}")
    meas = np.asarray(measured, dtype=np.float64).reshape(-1)
    bnd = np.broadcast_to(np.asarray(bound, dtype=np.float64), meas.shape)
    if len(labels) != meas.size:
        raise ValueError(f"{output}: {check} has {meas.size} values but {len(labels)} row labels")
    what = metric or check
    if meas.size == 0:
        flat = np.asarray(bound, dtype=np.float64).reshape(-1)
        b = float(flat[0]) if flat.size else math.nan
        return Verdict(output, check, True, None, math.nan, b, math.nan,
                       f"{what}: no rows to check (not applicable)", relation, (), 0, 0, metric)
    ok = _RELATIONS[relation](meas, bnd)
    margins = _margins(meas, bnd, relation)
    worst_i = int(np.argmin(margins))
    failing = tuple(labels[i] for i in np.flatnonzero(~ok))
    m, b = float(meas[worst_i]), float(bnd[worst_i])
    shown = ", ".join(str(r) for r in failing[:_SHOWN_ROWS]) + (" ..." if len(failing) > _SHOWN_ROWS else "")
    detail = _sentence(what, labels[worst_i], m, b, relation, not failing) + (
        f"; {len(failing)}/{meas.size} rows fail [{shown}]" if failing else f"; all {meas.size} rows pass")
    return Verdict(output, check, not failing, labels[worst_i], m, b, float(margins[worst_i]),
                   detail, relation, failing, len(failing), int(meas.size), metric)


def single(
    output: str,
    check: str,
    measured: float,
    bound: float,
    *,
    row: RowLabel = None,
    metric: str = "",
    relation: str = "<=",
    failing_rows: Sequence[RowLabel] = (),
    n_checked: int = 1,
    note: str = "",
) -> Verdict:
    """A verdict on one global value (rel-L2, cosine, a count); ``row`` locates its worst
    contribution and ``failing_rows`` the rows behind a failure, when known."""
    v = summarize(output, check, [measured], bound, [row], metric=metric, relation=relation)
    rows = tuple(failing_rows) if not v.passed else ()
    if not v.passed and not rows:
        rows = (row,)
    detail = _sentence(metric or check, row, v.measured, v.bound, relation, v.passed)
    if note:
        detail += f"; {note}"
    return Verdict(output, check, v.passed, row, v.measured, v.bound, v.margin, detail,
                   relation, rows, len(rows), n_checked, metric, note)


def all_passed(verdicts: Iterable[Verdict]) -> bool:
    return all(v.passed for v in verdicts)


def failures(verdicts: Iterable[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if not v.passed]


def worst(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The applicable verdict with the smallest margin (first one on ties); None when no
    verdict measured anything."""
    return min((v for v in verdicts if v.applicable), key=lambda v: v.margin, default=None)


def format_failures(verdicts: Iterable[Verdict]) -> str:
    """One :meth:`Verdict.line` per failing verdict, in input order; empty when all pass."""
    return "\n".join(v.line() for v in failures(verdicts))


def assert_all_passed(verdicts: Iterable[Verdict]) -> None:
    """Raise one AssertionError listing every failing verdict (for pytest and CLIs)."""
    verdicts = list(verdicts)
    if not all_passed(verdicts):
        __tracebackhide__ = True
        raise AssertionError(f"{len(failures(verdicts))} check(s) failed:\n{format_failures(verdicts)}")
