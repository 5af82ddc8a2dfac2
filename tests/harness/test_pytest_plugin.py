"""The pytest side: golden-alt cases carry the ``golden_alt`` marker, refused axis values
are a usage error with the harness's message, unknown entries read cleanly."""

import subprocess
import sys
from pathlib import Path

import pytest
from harness_fakes import fakes

from harness import registry
from harness.pytest_cases import entry_params

ROOT = Path(__file__).resolve().parents[2]


def _pytest(*argv):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", *argv],
                          cwd=ROOT, capture_output=True, text=True)


def _marks(param):
    return {m.name for m in param.marks}


def test_entry_params_mark_golden_alt_cases_only():
    with registry.registered(*fakes().values()):
        assert all("golden_alt" in _marks(p) for p in entry_params("fake_alt"))
        assert not any("golden_alt" in _marks(p) for p in entry_params("fake_kernel"))


def test_unknown_entry_reads_cleanly():
    with pytest.raises(registry.UnknownEntryError) as info:
        entry_params("rmsnrom")
    assert str(info.value).startswith("entry: rmsnrom is not registered")
    assert "did you mean rmsnorm" in str(info.value) and "'" not in str(info.value)


@pytest.mark.parametrize("flag,value,message", [
    ("--tp", "3", "tp: 3 is not one of (1, 2, 4, 8)"),
    ("--ep", "3", "ep: 3 is not one of (2, 4, 8)"),
    ("--dp", "0", "dp: 0 must be >= 1"),
])
def test_refused_axis_value_is_a_usage_error(flag, value, message):
    p = _pytest("cases/test_rmsnorm.py", "--collect-only", "-q", flag, value)
    assert p.returncode == 4, p.stdout + p.stderr
    assert message in p.stderr and "deselected" not in p.stdout


def test_not_golden_alt_selects_kernel_cases_only():
    kernel = _pytest("cases/", "--collect-only", "-q", "-m", "not golden_alt")
    alt = _pytest("cases/", "--collect-only", "-q", "-m", "golden_alt")
    assert kernel.returncode == 0 and alt.returncode == 0, kernel.stderr + alt.stderr

    def entries(p):
        ids = [x.split("[", 1)[1] for x in p.stdout.splitlines() if "::" in x]
        return {i.split("-", 1)[0] for i in ids}

    kinds = {n: e.sut_for("a5sim")[0].split(":")[0] for n, e in registry.entries().items()}
    assert entries(kernel) and {kinds[n] for n in entries(kernel)} == {"kernel"}
    assert entries(alt) and {kinds[n] for n in entries(alt)} == {"golden-alt"}


def test_entry_params_mark_the_cases_outside_the_representative_ones_matrix():
    import dataclasses
    base = fakes()["fake_kernel"]
    matrix = tuple(c.with_(entry="fake_tiered") for c in base.matrix)
    tiered = dataclasses.replace(base, name="fake_tiered", matrix=matrix, representative=matrix[:1])
    with registry.registered(tiered, *fakes().values()):
        marks = [_marks(p) for p in entry_params("fake_tiered")]
        assert "matrix" not in marks[0] and all("matrix" in m for m in marks[1:])
        assert not any("matrix" in _marks(p) for p in entry_params("fake_kernel"))


def _collected(*argv):
    """(case ids collected, the header's tier line present)."""
    p = _pytest("cases/test_attention_modes.py", "--collect-only", *argv)
    assert p.returncode == 0, p.stdout + p.stderr
    ids = {x.split("[", 1)[1].split("]", 1)[0] for x in p.stdout.splitlines() if "test_attention_mode[" in x}
    return ids, "representative cases only" in p.stdout


def test_a_run_that_selects_nothing_takes_the_representative_cases_only():
    tier, header = _collected()
    assert header
    full = {c.case_id for n in ("decode_attn_c1a_reindex", "decode_c1a_reindex")
            for c in registry.get(n).matrix}
    rep = {c.case_id for c in registry.get("decode_c1a_reindex").representative}
    assert rep and full & tier == rep  # the leaf's cases run in tests/platforms/test_a5sim_decode_attn.py
    for argv in (("-m", "not slow"), ("--full-matrix",)):
        everything, header = _collected(*argv)
        assert full <= everything and not header, argv
    picked, _ = _collected("-k", "c1a_reindex", "--tp", "4")
    assert {c.case_id for n in ("decode_attn_c1a_reindex", "decode_c1a_reindex")
            for c in registry.get(n).matrix if c.tp == 4} <= picked
