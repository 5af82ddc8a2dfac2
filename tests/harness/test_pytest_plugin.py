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
