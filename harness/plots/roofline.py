"""The bench's roofline chart (``python -m harness.bench --plot FILE``).

x = arithmetic intensity (all declared FLOPs / bytes moved), y = achieved throughput
(all declared FLOPs / the cost model's estimated time), both log scale.  The memory roof
(HBM bandwidth) and one compute roof per dtype of the platform file are drawn; every case
of the bench's ``--json`` rows is one labelled point computed from that row's own
``flops``, ``bytes`` and ``estimated_us``.  A kernel that moves data and does no arithmetic
(``rope_rows``: a gather) has no arithmetic intensity; its cases go on a side panel of
achieved bandwidth (bytes moved / estimated time) under the same HBM roof.  A row without an
estimate or bytes has no place on either: it is left off and named in the footnote.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from harness.plots import pyplot, save_figure

KEYED_ABOVE = 16  # more points than this: numbered, with a key beside the chart
KEY_COLUMN = 90  # key lines per column (two columns above)
_ROOF_NAMES = {"bf16": "BF16 cube", "fp8": "FP8 cube", "fp32": "FP32 cube",
               "vector_fp32": "FP32 vector"}


def point(row: dict) -> tuple[float, float] | None:
    """(FLOP per byte, TFLOP/s) of one bench JSON row, or None when it cannot be placed."""
    flops = sum(row["flops"].values())
    est = row.get("estimated_us")
    if not est or est <= 0 or flops <= 0 or row["bytes"] <= 0:
        return None
    return flops / row["bytes"], flops / (est * 1e-6) / 1e12


def bandwidth_point(row: dict) -> float | None:
    """Achieved TB/s of a row that declares bytes but no FLOPs (a pure data-movement
    kernel), or None."""
    est = row.get("estimated_us")
    if not est or est <= 0 or sum(row["flops"].values()) > 0 or row["bytes"] <= 0:
        return None
    return row["bytes"] / (est * 1e-6) / 1e12


def why_not_plotted(row: dict) -> str:
    if not row.get("estimated_us"):
        return f"no estimate (status {row.get('status')})"
    return "no bytes declared"


def point_label(row: dict) -> str:
    tp = f" tp{row['tp']}" if row.get("tp", 1) != 1 else ""
    return f"{row['entry']} T={row['tokens']}{tp}"


def _values(rows: list[dict], key: str) -> str:
    vals = sorted({r[key] for r in rows if r.get(key) is not None})
    return ",".join(str(v) for v in vals) or "-"


def chart_title(rows: list[dict]) -> str:
    """Preset(s), token count(s) and the simulated topology of the rows."""
    topo = rows[0]["topology"] if rows else {}
    sim = (f"simulated A5 {topo.get('cube_cores')} cube + {topo.get('vector_cores')} vector "
           f"cores, cycles at {topo.get('clock_mhz')} MHz" if topo else "no topology")
    only = ", cost model only (not interpreted)" if any(
        r.get("verify_level") == "cost" for r in rows) else ""
    return (f"Roofline: preset {_values(rows, 'preset')}, tokens {_values(rows, 'tokens')}"
            f"{only}\n{sim}")


def roofline_figure(rows: list[dict], hbm_bytes_per_s: float, peaks: dict[str, float]):
    """(figure, data read back from its artists) for the bench ``rows``; ``peaks`` are
    FLOP/s per compute dtype, ``hbm_bytes_per_s`` the memory roof."""
    plt = pyplot()
    placed = [(r, point(r)) for r in rows]
    moving = [(r, b) for r, p in placed if p is None and (b := bandwidth_point(r)) is not None]
    left_off = [r for r, p in placed if p is None and bandwidth_point(r) is None]
    placed = [(r, p) for r, p in placed if p is not None]
    bw = hbm_bytes_per_s / 1e12  # TB/s: TFLOP/s per FLOP/byte
    ridges = [pk / 1e12 / bw for pk in peaks.values()]
    xs = [p[0] for _, p in placed] + ridges
    lo, hi = min(xs) / 10, max(xs) * 10
    keyed = len(placed) + len(moving) > KEYED_ABOVE  # numbers on the points, names in a key
    widths = (5,) + ((0.8,) if moving else ()) + ((1.6,) if keyed else ())
    height = max(6.5, 0.125 * (len(placed) + len(moving)) + 1.5) if keyed else 6.5
    fig, axes = plt.subplots(1, len(widths), figsize=(2 * sum(widths), height), width_ratios=widths,
                             squeeze=False)
    ax, side = axes[0][0], axes[0][1] if moving else None
    labels = _labeller(axes[0][-1] if keyed else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(peaks.values()) / 1e12
    ax.plot([lo, top / bw], [bw * lo, top], color="black", lw=1.5,
            label=f"HBM {bw:.2f} TB/s", gid="roof:memory")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (dtype, pk) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        p = pk / 1e12
        ax.plot([p / bw, hi], [p, p], ls="--", lw=1.2, color=colours[(i + 3) % len(colours)],
                label=f"{_ROOF_NAMES.get(dtype, dtype)} {p:.1f} TFLOP/s", gid=f"roof:{dtype}")
    seen: list[tuple[float, float]] = []
    for r, (x, y) in placed:
        colour = "tab:blue" if r["bound"] == "memory" else "tab:red"
        ax.scatter([x], [y], s=36, color=colour, zorder=3, gid=f"point:{r['case']}")
        near = sum(1 for sx, sy in seen  # earlier points on the same spot: stack labels
                   if abs(math.log10(sx / x)) < 0.05 and abs(math.log10(sy / y)) < 0.05)
        seen.append((x, y))
        labels(ax, r, (x, y), (5, 4 - 9 * near), 0)
    ax.scatter([], [], color="tab:blue", label="case (memory-bound roofline)")
    ax.scatter([], [], color="tab:red", label="case (compute-bound roofline)")
    ax.set_xlim(lo, hi)
    ys = [p[1] for _, p in placed]
    ax.set_ylim(min(ys + [bw * lo]) / 3, top * 3)
    ax.set_xlabel("arithmetic intensity (declared FLOPs / bytes moved)")
    ax.set_ylabel("achieved TFLOP/s (declared FLOPs / estimated A5 time)")
    ax.set_title(chart_title(rows), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    note = textwrap.wrap("not on the chart: " + "; ".join(
        f"{point_label(r)} ({why_not_plotted(r)})" for r in left_off), 170) if left_off else []
    if note:
        fig.text(0.01, 0.005, "\n".join(note), fontsize=7, va="bottom")
    if side is not None:
        _bandwidth_panel(side, moving, bw, labels)
    labels.finish()
    fig.tight_layout(rect=(0, 0.022 * len(note), 1, 1))
    return fig, _read_back(ax, side, left_off)


def _labeller(key_ax):
    """``label(ax, row, xy, offset, rotation)``: the point's name beside it, or (with a key
    axes) its number beside it and ``number  name  estimate  ratio to its roofline`` in the
    key; the full name is
    the annotation's gid either way (read back by :func:`_read_back`)."""
    lines: list[str] = []

    def label(ax, row, xy, offset, rotation):
        name = point_label(row)
        if key_ax is None:
            text = name
        else:
            ratio = f"  {row['ratio']:.1f}x" if row.get("ratio") else ""
            lines.append(f"{len(lines) + 1:>3}  {name}  {row['estimated_us']:,.1f} us{ratio}")
            text = str(len(lines))
        ax.annotate(text, xy, textcoords="offset points", xytext=offset, fontsize=7,
                    rotation=rotation, gid=f"label:{name}")

    def finish():
        if key_ax is None:
            return
        key_ax.axis("off")
        half = (len(lines) + 1) // 2 if len(lines) > KEY_COLUMN else len(lines)
        for col, chunk in enumerate((lines[:half], lines[half:])):
            if chunk:
                key_ax.text(0.5 * col, 1.0, "\n".join(chunk), transform=key_ax.transAxes,
                            va="top", ha="left", fontsize=6.5, family="monospace")
    label.finish = finish
    return label


def _bandwidth_panel(ax, moving: list[tuple[dict, float]], bw: float, labels) -> None:
    """Achieved TB/s of the data-movement cases, one column each, under the HBM roof."""
    ax.set_yscale("log")
    ax.axhline(bw, color="black", lw=1.5, gid="roof:bandwidth", label=f"HBM {bw:.2f} TB/s")
    for i, (r, tbps) in enumerate(moving):
        ax.scatter([i], [tbps], s=36, color="tab:blue", zorder=3, gid=f"bandwidth:{r['case']}")
        labels(ax, r, (i, tbps), (4, 4), 60)
    ax.set_xlim(-0.5, len(moving) - 0.5 + 0.8)
    ax.set_xticks([])
    ax.set_ylim(min(t for _, t in moving) / 10, bw * 3)
    ax.set_ylabel("achieved TB/s (bytes moved / estimated A5 time)")
    ax.set_title("no arithmetic", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _name(text) -> str:
    return (text.get_gid() or "label:")[len("label:"):]


def _read_back(ax, side, left_off: list[dict]) -> dict:
    """The points and roofs as drawn (from the artists, not from the inputs)."""
    labels = [_name(t) for t in ax.texts]
    points = [c for c in ax.collections if (c.get_gid() or "").startswith("point:")]
    data = {"title": ax.get_title(), "x_scale": ax.get_xscale(), "y_scale": ax.get_yscale(),
            "points": [], "roofs": {}, "bandwidth_points": [],
            "left_off": [r["case"] for r in left_off]}
    for coll, label in zip(points, labels):
        (x, y), = coll.get_offsets().tolist()
        data["points"].append({"case": coll.get_gid()[len("point:"):], "label": label,
                               "intensity": x, "tflops": y})
    for line in ax.lines:
        gid = line.get_gid() or ""
        if gid.startswith("roof:"):
            xd, yd = line.get_data()
            data["roofs"][gid[len("roof:"):]] = {"x": [float(v) for v in xd],
                                                 "y": [float(v) for v in yd]}
    if side is not None:
        moved = [c for c in side.collections if (c.get_gid() or "").startswith("bandwidth:")]
        for coll, text in zip(moved, side.texts):
            (_, y), = coll.get_offsets().tolist()
            data["bandwidth_points"].append({"case": coll.get_gid()[len("bandwidth:"):],
                                             "label": _name(text), "tbps": y})
        for line in side.lines:
            if line.get_gid() == "roof:bandwidth":
                data["roofs"]["bandwidth"] = {"y": [float(v) for v in line.get_ydata()]}
    return data


def write_roofline(rows: list[dict], path: str | Path, hbm_bytes_per_s: float,
                   peaks: dict[str, float]) -> tuple[Path, dict]:
    """Draw the chart of ``rows`` into ``path`` (.png/.svg); returns (path, plotted data)."""
    fig, data = roofline_figure(rows, hbm_bytes_per_s, peaks)
    return save_figure(fig, path, data), data
