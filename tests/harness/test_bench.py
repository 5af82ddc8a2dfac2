"""Bench roofline arithmetic and case selection (no launches)."""

import pytest

from harness import registry
from harness.bench import (CUBE_PEAK_FLOPS, HBM_BYTES_PER_S, bench_cases, case_work, roofline_us)
from harness.case import Case


def test_a5_figures_from_the_platform_file():
    assert CUBE_PEAK_FLOPS == pytest.approx(28 * 4096 * 2 * 1.65e9)
    assert HBM_BYTES_PER_S == pytest.approx(28 * 31 * 1.65e9)


def test_roofline_takes_the_binding_resource():
    assert roofline_us(int(HBM_BYTES_PER_S), 0) == pytest.approx(1e6)
    assert roofline_us(0, int(CUBE_PEAK_FLOPS)) == pytest.approx(1e6)
    assert roofline_us(int(HBM_BYTES_PER_S), int(2 * CUBE_PEAK_FLOPS)) == pytest.approx(2e6)


def test_rmsnorm_bytes_are_its_abi_tensors():
    entry = registry.get("rmsnorm")
    nbytes, flops = case_work(entry, Case(entry="rmsnorm", tokens=10, preset="flash"))
    assert nbytes == (10 * 5120 * 2) * 2 + 5120 * 2 and flops == 0


def test_bench_selects_kernel_entries_and_shapes():
    cases = bench_cases(["rmsnorm"], "flash", [1, 192])
    assert [(c.preset, c.tokens) for c in cases] == [("flash", 1), ("flash", 192)]
    assert all(registry.get(c.entry).kernels for c in bench_cases([], None, None))
