"""Fixtures for the queue-runner tests: tiny synthetic pytest projects in tmp_path."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

# Spelled in two pieces so the runner never mistakes these test files for CI entries.
MARK = "# ci: " + "a5"

PROJECT_CONFTEST = '''
pytest_plugins = ["ci.collect"]


def pytest_addoption(parser):
    for opt in ("--tp", "--dp", "--ep", "--device"):
        parser.addoption(opt, default=None)
'''


@pytest.fixture(autouse=True)
def _lean_pytest(monkeypatch):
    """Synthetic nodes skip third-party plugin autoload (hypothesis, xdist): ~1 s less each."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def project(tmp_path: Path):
    """``project({"test_x.py": source, ...})`` -> root of a synthetic pytest project.

    Sources are dedented, and a leading ``MARK`` line is replaced by the CI marker.
    """
    def make(files: dict[str, str]) -> Path:
        root = tmp_path / "proj"
        root.mkdir(exist_ok=True)
        (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        (root / "conftest.py").write_text(PROJECT_CONFTEST)
        for name, source in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source).lstrip().replace("MARK", MARK, 1))
        return root
    return make


@pytest.fixture
def run_queue(tmp_path: Path):
    """Run ``ci.queue.main`` in-process; returns (exit status, rows by node id, out dir)."""
    from ci import queue

    def run(root: Path, *args: str):
        out = tmp_path / "out"
        rc = queue.main(["--root", str(root), "--out", str(out), "--backend", "local", *args])
        data = json.loads((out / "results.json").read_text())
        return rc, {r["node"]: r for r in data["nodes"]}, out
    return run
