"""Error plots of a failing case: one picture per failing row-bound or ownership check.

* Row-bound outputs (``check_row_bound``): every checked row's RMS and peak error divided
  by its bound (log scale, 1.0 drawn as the limit, failing rows ringed in red,
  non-finite rows drawn at the top with an x), then the worst row (largest error/bound)
  along the hidden dimension: actual and reference, and their difference with the row's
  peak bound.
* Cache outputs (``check_non_owned_bytes``): the slots as a grid (blocks x positions for
  a paged cache), coloured by owned / changed, with every changed slot the mode does not
  own marked, and the changed elements per changed slot.

The numbers come from the comparison itself (see :mod:`harness.plots.capture`), re-run on
the same tensors; a re-run whose verdicts differ from the given ones, or a marked set that
differs from the verdict's failing rows, is a :class:`~harness.plots.PlotError`.  A
passing case gets no plot.  Other failing checks (Top-K, C2A budget, ...) are not drawn;
they are returned as notes naming them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.plots import PlotError, pyplot, save_figure
from harness.plots.capture import OwnershipCall, RowBoundCall, capture

PLOTS_DIR = "plots"  # next to the saved case: <case folder>/plots/
_RATIO_CHECKS = ("row_rms", "row_peak")


@dataclass
class PlotSet:
    """The files written for one case and the failing checks left undrawn (with why)."""

    paths: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "output"


def _key(v) -> tuple:
    return (v.output, v.check, str(v.row), v.passed)


def plot_failures(entry, case, inputs, golden, actual, outdir, verdicts=None) -> PlotSet:
    """Re-run ``entry``'s comparison of ``actual`` under capture and draw every failing
    row-bound and ownership check of ``case`` into ``outdir``.  ``verdicts`` (when given)
    must be what that comparison returns.  Nothing is written when every check passes."""
    if verdicts is not None and all(v.passed for v in verdicts):
        return PlotSet()
    with capture() as cap:
        again = entry.compare(case.config, case, inputs, golden, actual)
    if verdicts is not None and [_key(v) for v in again] != [_key(v) for v in verdicts]:
        raise PlotError(f"{case.case_id}: the comparison re-run for plotting gives other "
                        f"verdicts than the ones to plot")
    out = PlotSet()
    if all(v.passed for v in again):
        return out
    drawn = set()
    used = set()
    for call in cap.row_bound + cap.ownership:
        if all(v.passed for v in call.verdicts):
            continue
        kind = "rows" if isinstance(call, RowBoundCall) else "cache"
        name = f"{kind}-{_slug(call.output)}"
        n = 2
        while name in used:
            name, n = f"{kind}-{_slug(call.output)}-{n}", n + 1
        used.add(name)
        path = Path(outdir) / f"{name}.png"
        draw = _draw_rows if kind == "rows" else _draw_cache
        out.paths.append(draw(call, case.case_id, path))
        drawn.update(_key(v) for v in call.verdicts)
    for v in again:
        if not v.passed and _key(v) not in drawn:
            out.notes.append(f"{v.output}.{v.check}: failing, not plotted (plots cover "
                             f"row-bound and cache-ownership checks)")
    return out


def plot_saved_case(folder, outdir=None, expect_wiring: str | None = None) -> PlotSet:
    """:func:`plot_failures` for a case folder written by ``--save-data``; the files go to
    ``outdir`` or, by default, to ``<folder>/plots/``."""
    from harness import registry
    from harness.data import DataError, load_case
    try:
        case, _, t = load_case(folder, expect_wiring)
    except DataError as err:
        raise PlotError(f"saved case unreadable: {err}") from None
    target = Path(outdir) if outdir is not None else Path(folder) / PLOTS_DIR
    return plot_failures(registry.get(case.entry), case, t["inputs"], t["golden"], t["actual"],
                         target)


# -- row-bound outputs ------------------------------------------------------------------

def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def row_ratios(call: RowBoundCall) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """({check: measured/bound per row}, failing mask): a row fails when a check's
    measured value is not <= its bound (NaN fails) or it holds non-finite values."""
    ratios, failing = {}, np.zeros(len(call.labels), dtype=bool)
    for check in _RATIO_CHECKS:
        m, b = call.checks[check]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios[check] = m / b
        failing |= ~(m <= b)
    if "finite" in call.checks:
        failing |= ~(call.checks["finite"][0] <= 0)
    return ratios, failing


def _draw_rows(call: RowBoundCall, case_id: str, path: Path) -> Path:
    plt = pyplot()
    ratios, failing = row_ratios(call)
    labels = [str(lb) for lb in call.labels]
    ints = all(isinstance(lb, int) for lb in call.labels)
    x = np.array(call.labels if ints else range(len(call.labels)), dtype=np.float64)
    worst_key = np.nan_to_num(np.maximum(ratios["row_rms"], ratios["row_peak"]), nan=np.inf)
    worst = int(np.argmax(worst_key))
    finite_vals = np.concatenate([r[np.isfinite(r) & (r > 0)] for r in ratios.values()])
    floor = min(1e-6, finite_vals.min() / 2) if finite_vals.size else 1e-6
    ceiling = max(2.0, finite_vals.max() * 3) if finite_vals.size else 10.0
    fig, (ax, ax_row, ax_diff) = plt.subplots(3, 1, figsize=(11, 10),
                                              gridspec_kw={"height_ratios": [1.3, 1, 1]})
    ax.set_yscale("log")
    for check, marker, colour in (("row_rms", "o", "tab:blue"), ("row_peak", "^", "tab:orange")):
        r = ratios[check]
        ok = np.isfinite(r)
        ax.scatter(x[ok], np.clip(r[ok], floor, None), s=14, marker=marker, color=colour,
                   label=f"{check}: {'RMS(a-r)' if check == 'row_rms' else 'max|a-r|'} / bound"
                         + (" (exact rows at the bottom)" if (r[ok] == 0).any() else ""),
                   zorder=3)
        if (~ok).any():
            ax.scatter(x[~ok], np.full((~ok).sum(), ceiling), s=40, marker="x", color=colour,
                       zorder=4, label=f"{check}: non-finite (drawn at the top)")
    ax.scatter(x[failing], np.clip(np.nan_to_num(worst_key[failing], posinf=ceiling),
                                   floor, ceiling),
               s=90, facecolors="none", edgecolors="red", linewidths=1.4, zorder=5,
               gid="failing", label=f"failing rows ({int(failing.sum())})")
    ax.axhline(1.0, color="red", lw=1.2, ls="--", label="limit (error = bound)", gid="limit")
    ax.set_ylim(floor / 2, ceiling * 2)
    ax.set_ylabel("error / bound (log)")
    ax.set_xlabel("row" if ints else "row (position among checked rows)")
    if not ints and len(labels) <= 32:
        ax.set_xticks(x, labels, rotation=60, fontsize=6)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"{case_id}\noutput {call.output}: {int(failing.sum())} of {len(labels)} "
                 f"rows fail the per-row bound", fontsize=9)
    a, r = call.actual[worst].numpy(), call.ref[worst].numpy()
    hidden = np.arange(a.shape[0])
    ax_row.plot(hidden, r, lw=0.8, color="black", label="reference")
    ax_row.plot(hidden, a, lw=0.8, color="tab:red", alpha=0.8, label="actual")
    ax_row.set_ylabel("value")
    ax_row.set_title(f"worst row {labels[worst]} (largest error/bound) along the hidden "
                     f"dimension", fontsize=9)
    ax_row.legend(fontsize=7)
    peak_bound = float(call.checks["row_peak"][1][worst])
    ax_diff.plot(hidden, a - r, lw=0.8, color="tab:purple", label="actual - reference")
    for sign in (1, -1):
        ax_diff.axhline(sign * peak_bound, color="red", ls="--", lw=1,
                        label="peak bound" if sign == 1 else None)
    rms_m, rms_b = call.checks["row_rms"][0][worst], call.checks["row_rms"][1][worst]
    peak_m = call.checks["row_peak"][0][worst]
    ax_diff.set_title(f"row {labels[worst]}: RMS(a-r) {rms_m:.3g} (bound {rms_b:.3g}), "
                      f"max|a-r| {peak_m:.3g} (bound {peak_bound:.3g})"
                      + ("; non-finite values marked x" if not np.isfinite(a).all() else ""),
                      fontsize=9)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        ax_diff.scatter(bad, np.zeros(bad.size), marker="x", color="red", zorder=4,
                        label=f"non-finite actual ({bad.size} values)")
        ax_row.scatter(bad, np.zeros(bad.size), marker="x", color="red", zorder=4)
    ax_diff.set_xlabel("hidden index")
    ax_diff.legend(fontsize=7)
    fig.tight_layout()
    by_x = {float(xi): lb for xi, lb in zip(x, labels)}
    marked = [c for c in ax.collections if c.get_gid() == "failing"][0]
    data = {"kind": "rows", "case": case_id, "output": call.output, "rows": labels,
            "rms_ratio": [_finite_or_none(v) for v in ratios["row_rms"]],
            "peak_ratio": [_finite_or_none(v) for v in ratios["row_peak"]],
            "marked": [by_x[float(px)] for px, _ in marked.get_offsets().tolist()],
            "limit": [float(ln.get_ydata()[0]) for ln in ax.lines if ln.get_gid() == "limit"][0],
            "worst_row": labels[worst]}
    return save_figure(fig, path, data)


# -- cache ownership --------------------------------------------------------------------

def _grid(call: OwnershipCall) -> tuple[int, int, str, str]:
    """(grid rows, columns, y label, x label) of the slot picture."""
    n = call.changed.shape[0]
    if len(call.lead) >= 2 and call.lead[0] > 0:
        return call.lead[0], n // call.lead[0], "block", "slot within block"
    width = max(1, min(n, 64))
    return -(-n // width), width, f"slot // {width}", f"slot % {width}"


def _draw_cache(call: OwnershipCall, case_id: str, path: Path) -> Path:
    plt = pyplot()
    from matplotlib.colors import ListedColormap
    n = call.changed.shape[0]
    changed = call.changed > 0
    violating = changed & ~call.owned
    slots = [int(i) for i in np.flatnonzero(violating)]
    failing = sorted(int(r) for v in call.verdicts if not v.passed for r in v.failing_rows)
    if slots != failing:
        raise PlotError(f"{case_id}: {call.output}: recorded changed non-owned slots "
                        f"{slots[:8]} differ from the verdict's failing rows {failing[:8]}")
    rows, cols, ylab, xlab = _grid(call)
    category = np.where(violating, 3, np.where(changed, 2, np.where(call.owned, 1, 0)))
    cells = np.full(rows * cols, np.nan)
    cells[:n] = category
    fig, (ax, ax_bar) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [2, 1]})
    cmap = ListedColormap(["white", "#d9d9d9", "#9ecae1", "#d62728"])
    ax.imshow(cells.reshape(rows, cols), cmap=cmap, vmin=-0.5, vmax=3.5, aspect="auto",
              interpolation="nearest")
    ax.scatter([s % cols for s in slots], [s // cols for s in slots], s=30, marker="s",
               facecolors="none", edgecolors="black", linewidths=0.8, gid="failing")
    for colour, text in zip(cmap.colors, ("not owned, unchanged", "owned, unchanged",
                                          "owned, changed", "NOT owned, changed")):
        ax.scatter([], [], marker="s", color=colour, edgecolors="grey", label=text)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    ax.set_ylabel(ylab)
    ax.set_xlabel(xlab)
    ax.set_title(f"{case_id}\ncache {call.output}: {len(slots)} slots the mode does not own "
                 f"changed (of {int((~call.owned).sum())} not owned, {n} slots)", fontsize=9)
    idx = np.flatnonzero(changed)
    ax_bar.bar(idx, call.changed[idx], width=1.0,
               color=["#d62728" if violating[i] else "#6baed6" for i in idx])
    ax_bar.set_xlim(-0.5, n - 0.5)
    ax_bar.set_xlabel("slot (row over the leading dims)")
    ax_bar.set_ylabel("changed elements")
    ax_bar.set_title("changed elements per slot (red: not owned)", fontsize=9)
    fig.tight_layout()
    marked = [c for c in ax.collections if c.get_gid() == "failing"][0]
    data = {"kind": "cache", "case": case_id, "output": call.output, "slots": n,
            "grid": [rows, cols], "owned": int(call.owned.sum()),
            "changed": int(changed.sum()),
            "marked": [int(round(py)) * cols + int(round(px))
                       for px, py in marked.get_offsets().tolist()]}
    return save_figure(fig, path, data)
