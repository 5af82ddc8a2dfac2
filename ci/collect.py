"""Node collection for the CI queue runner.

As a pytest plugin (loaded by the root ``conftest.py`` or ``-p ci.collect``) it adds
``--collect-nodes=PATH``: with ``--collect-only`` it writes JSON
``[{"nodeid", "axes", "cards"}]`` for every collected item, where ``axes`` are the item's
JSON-scalar ``callspec.params`` and ``cards`` is ``ep`` when an ``ep`` axis is set, else
``tp * dp`` (missing axes count as 1).

As a library it finds the ``# ci: a5`` entry files, collects each entry in a pytest
subprocess, and (sweep mode) reads an entry's ``--tp/--dp/--ep`` argparse ``choices`` by
running ``python -m ci.collect --cli-matrix ENTRY``, which stops the entry at ``parse_args``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MARK = re.compile(r"^#\s*ci:\s*a5\s*$", re.M)
SKIP_DIRS = {"ci", "out", "output", "build", "dist", "__pycache__", "node_modules", "venv",
             "plog", "kernel_meta"}
CI_PARENT = str(Path(__file__).resolve().parent.parent)   # makes ``ci`` importable


def card_count(axes: dict) -> int:
    if axes.get("ep") is not None:
        return int(axes["ep"])
    return int(axes.get("tp") or 1) * int(axes.get("dp") or 1)


def pytest_addoption(parser) -> None:
    parser.addoption("--collect-nodes", metavar="PATH", default=None,
                     help="with --collect-only: write [{nodeid, axes, cards}] JSON to PATH")


def pytest_collection_finish(session) -> None:
    path = session.config.getoption("collect_nodes")
    if not path:
        return
    nodes = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        axes = {k: v for k, v in params.items()
                if v is None or isinstance(v, (bool, int, float, str))}
        try:
            cards = card_count(axes)
        except (TypeError, ValueError):
            import pytest
            raise pytest.UsageError(f"{item.nodeid}: no card count from axes {axes}") from None
        nodes.append({"nodeid": item.nodeid, "axes": axes, "cards": cards})
    Path(path).write_text(json.dumps(nodes, indent=1) + "\n")


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CI_PARENT, env.get("PYTHONPATH")) if p)
    return env


def marked_entries(root: Path) -> list[str]:
    """Root-relative paths of the ``.py`` files holding a line ``# ci: a5``."""
    found = []
    for dirpath, dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.endswith(".egg-info")
                         and not (rel == Path(".") and d in SKIP_DIRS) and d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                try:
                    text = (Path(dirpath) / name).read_text(errors="replace")
                except OSError:
                    continue
                if MARK.search(text):
                    found.append((rel / name).as_posix())
    return found


def collect_entry(entry: str, root: Path, python: str = sys.executable,
                  timeout: float = 600) -> tuple[list[dict], str | None]:
    """Nodes of one entry (file, directory or node id) and an error text or None."""
    with tempfile.TemporaryDirectory(prefix="ci-collect-") as tmp:
        dump = Path(tmp) / "nodes.json"
        argv = [python, "-m", "pytest", entry, "--collect-only", "-q", "-p", "ci.collect",
                "-p", "no:cacheprovider", "--rootdir", str(root), f"--collect-nodes={dump}"]
        try:
            p = subprocess.run(argv, cwd=root, env=child_env(), capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return [], f"collection timed out after {timeout:g}s"
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        if p.returncode not in (0, 5) or not dump.exists():
            return [], f"collection failed (exit {p.returncode}):\n{tail}"
        nodes = json.loads(dump.read_text())
    if not nodes:
        return [], "no nodes collected"
    return nodes, None


def cli_matrix(entry: str, root: Path, python: str = sys.executable,
               timeout: float = 300) -> tuple[dict, str | None]:
    """``{"tp": [...], "dp": [...], "ep": [...]}`` choices of an entry's CLI, or an error."""
    p = subprocess.run([python, "-m", "ci.collect", "--cli-matrix", entry], cwd=root,
                       env=child_env(), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {}, f"CLI matrix failed (exit {p.returncode}): {p.stderr.strip()[-500:]}"
    return json.loads(lines[-1]), None


def registry_matrix(entry: str) -> tuple[dict, str | None]:
    """``{"tp": [...], "dp"|"ep": [...]}`` of a harness registry entry's declared support."""
    from harness import registry
    try:
        support = registry.get(entry).support
    except KeyError as err:
        return {}, str(err)
    choices = {"tp": sorted(support.tp_sizes)}
    eps = sorted(e for e in support.ep_sizes if e is not None)
    if eps:
        choices["ep"] = eps
    else:
        choices["dp"] = sorted(support.dp_sizes)
    return choices, None


def is_registry_entry(entry: str) -> bool:
    """A sweep entry is a harness registry name unless it names a Python file."""
    return not entry.endswith(".py")


def sweep_nodes(entry: str, choices: dict, args: list[str]) -> list[dict]:
    """The full CLI matrix: TP x DP; else TP x EP with EP % TP == 0 (cards = EP); else TP."""
    tps = choices.get("tp") or [1]
    if "dp" in choices:
        combos = [{"tp": t, "dp": d} for t, d in itertools.product(tps, choices["dp"])]
    elif "ep" in choices:
        combos = [{"tp": t, "ep": e} for t, e in itertools.product(tps, choices["ep"])
                  if e % t == 0]
    elif "tp" in choices:
        combos = [{"tp": t} for t in tps]
    else:
        combos = [{}]
    return [{"nodeid": entry + ("[" + ",".join(f"{k}={v}" for k, v in c.items()) + "]"
                                if c else ""),
             "axes": c, "cards": card_count(c), "kind": "cli", "entry": entry, "args": args}
            for c in combos]


class _Stop(Exception):
    pass


def _dump_cli_matrix(entry: str) -> int:
    import argparse
    import runpy

    found: dict[str, list[int]] = {}

    def stop(self, args=None, namespace=None):
        for action in self._actions:
            for axis in ("tp", "dp", "ep"):
                if f"--{axis}" in action.option_strings and action.choices:
                    found[axis] = sorted(int(c) for c in action.choices)
        raise _Stop

    argparse.ArgumentParser.parse_known_args = stop  # type: ignore[method-assign]
    sys.argv = [entry]
    sys.path.insert(0, str(Path(entry).resolve().parent))
    try:
        runpy.run_path(entry, run_name="__main__")
    except _Stop:
        print(json.dumps(found))
        return 0
    print(f"{entry}: never reached ArgumentParser.parse_args", file=sys.stderr)
    return 2


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cli-matrix":
        sys.exit(_dump_cli_matrix(sys.argv[2]))
    sys.exit("usage: python -m ci.collect --cli-matrix ENTRY")
