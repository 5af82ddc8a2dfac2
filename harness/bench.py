"""``python -m harness.bench``: estimated A5 time per kernel and shape, next to a roofline.

Each kernel case runs through the harness (so only a validated kernel is timed); the
cost model's AICore end-to-end estimate is deterministic, unlike wall time on these
shared machines.  The roofline bound is ``max(bytes / HBM bandwidth, FLOPs / Cube peak)``
with bytes = every ABI tensor moved once (inputs read, outputs written) and FLOPs as the
entry declares them (0 for vector-only kernels).

A5 figures (Ascend 950PR, from ``harness/platforms/data/Ascend950PR_9579.ini``, the
compiler platform file the cost model is configured with):
- Cube peak BF16: 28 cube cores x 16x16x16 MAC/cycle x 2 FLOP x 1.65 GHz = 378.5 TFLOP/s
  (``cube_core_cnt``, ``cube_m/n/k_size``, ``cube_freq``).
- HBM bandwidth: 28 cores x 31 B/cycle (``ddr_rate``) x 1.65 GHz = 1.43 TB/s.
The cost model converts cycles at 1800 MHz (its swim-lane convention); both figures are
stated so a reader can redo the arithmetic.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from harness import registry
from harness.case import Case

CUBE_CORES = 28
CUBE_MACS_PER_CYCLE = 16 * 16 * 16
CUBE_HZ = 1.65e9
DDR_BYTES_PER_CYCLE = 31
CUBE_PEAK_FLOPS = CUBE_CORES * CUBE_MACS_PER_CYCLE * 2 * CUBE_HZ
HBM_BYTES_PER_S = CUBE_CORES * DDR_BYTES_PER_CYCLE * CUBE_HZ


def roofline_us(nbytes: int, flops: int) -> float:
    """Lower bound in microseconds for moving ``nbytes`` and computing ``flops``."""
    return max(nbytes / HBM_BYTES_PER_S, flops / CUBE_PEAK_FLOPS) * 1e6


def case_work(entry, case: Case) -> tuple[int, int]:
    """(bytes, FLOPs) of one case: ABI tensors moved once, FLOPs from the entry."""
    cfg = case.config
    inputs = entry.build_inputs(cfg, case)
    nbytes = sum(t.numel() * t.element_size() for t in inputs.values())
    flops = entry.flops(cfg, case) if entry.flops is not None else 0
    return nbytes, flops


def bench_cases(names: list[str], preset: str | None, tokens: list[int] | None) -> list[Case]:
    cases = []
    for name, entry in registry.entries().items():
        if (names and name not in names) or "a5sim" not in entry.kernels:
            continue
        pool = list(entry.matrix) + list(entry.slow_cases)
        if preset:
            pool = [c for c in pool if c.preset == preset] or [replace(pool[0], preset=preset)]
        if tokens:
            pool = [replace(pool[0], tokens=t, active_tokens=None) for t in tokens]
        seen = set()
        for c in pool:
            key = (c.preset, c.tokens, c.tp, c.dp, c.ep, c.wiring)
            if key not in seen:
                seen.add(key)
                cases.append(c)
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.splitlines()[0])
    ap.add_argument("entries", nargs="*", help="entry names (default: every kernel entry)")
    ap.add_argument("--preset", choices=("tiny", "flash"), default=None)
    ap.add_argument("--tokens", type=int, action="append", default=None)
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from harness.runner import run_case
    cases = bench_cases(args.entries, args.preset, args.tokens)
    if not cases:
        print("bench: no kernel entry matches", file=sys.stderr)
        return 2
    table = Table(title="Estimated A5 time (cost model) vs roofline")
    for col in ("entry", "preset", "tokens", "tp", "est. A5 us", "total cycles", "roofline us",
                "est/roofline", "MB moved", "GFLOP", "wall s", "verdict"):
        table.add_column(col)
    bad = 0
    for case in cases:
        entry = registry.get(case.entry)
        r = run_case(case)
        nbytes, flops = case_work(entry, case)
        est = r.estimated_a5_us()
        roof = roofline_us(nbytes, flops)
        cycles = max((c.get("total_cycles", 0) for c in r.costs), default=None)
        bad += r.status != "pass"
        table.add_row(case.entry, case.preset, str(case.tokens), str(case.tp),
                      f"{est:.2f}" if est is not None else "-", str(cycles or "-"),
                      f"{roof:.3f}", f"{est / roof:.1f}x" if est and roof else "-",
                      f"{nbytes / 1e6:.3f}", f"{flops / 1e9:.3f}", f"{r.seconds:.1f}", r.status)
    con = Console()
    con = con if con.is_terminal else Console(width=200)
    con.print(table)
    con.print(f"A5 figures: Cube peak {CUBE_PEAK_FLOPS / 1e12:.1f} TFLOP/s BF16, HBM "
              f"{HBM_BYTES_PER_S / 1e12:.2f} TB/s (Ascend950PR_9579.ini); estimates are the cost "
              f"model's AICore end-to-end time, deterministic run to run.", highlight=False)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
