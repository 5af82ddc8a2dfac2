"""``--changed-since REV``: entries affected by a change, via the reverse-import closure.

The project's Python files form an import graph (parsed with ``ast``, never imported).
``import a.b.c`` depends on ``a``, ``a.b`` and ``a.b.c`` (package ``__init__`` files run
too); ``from x import y`` also on ``x.y`` when that is a module; relative imports resolve
against the importing file's folder; a bare ``import name`` that is no root-level module
resolves to a sibling file (scripts run with their folder on ``sys.path``), root names
shadowing siblings. The files changed since the merge base of ``REV`` and ``HEAD`` (committed,
staged, unstaged and untracked) seed the closure. A change to any ``conftest.py``, to the
runner (``ci/``) or to the pytest/project configuration selects everything, and so does a git
failure: a selection that cannot be computed must not turn into a green run.
"""

from __future__ import annotations

import ast
import os
import subprocess
from collections import defaultdict
from pathlib import Path, PurePosixPath

EVERYTHING_FILES = {"conftest.py", "pyproject.toml", "pytest.ini", "setup.cfg", "tox.ini"}
SKIP_DIRS = {"out", "output", "build", "dist", "node_modules", "venv", "__pycache__"}


def selects_everything(path: str) -> bool:
    p = PurePosixPath(path)
    return p.name == "conftest.py" or path in EVERYTHING_FILES or p.parts[:1] == ("ci",)


def python_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                   and not d.endswith(".egg-info")]
        rel = Path(dirpath).relative_to(root)
        out += [(rel / f).as_posix() for f in files if f.endswith(".py")]
    return sorted(out)


def module_name(rel: str) -> str:
    parts = list(PurePosixPath(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imports_of(rel: str, source: str, index: dict[str, str]) -> set[str]:
    """Project files that ``rel`` imports (directly)."""
    try:
        tree = ast.parse(source, filename=rel)
    except SyntaxError:
        return set()
    folder = list(PurePosixPath(rel).parent.parts)
    here = ".".join(folder)
    deps: set[str] = set()

    def absolute(name: str) -> list[str]:
        top = name.split(".")[0]
        if top not in index and here and f"{here}.{top}" in index:   # sibling script import
            return [f"{here}.{p}" for p in _prefixes(name)]
        return _prefixes(name)

    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                names += absolute(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(folder):
                    continue
                up = folder[:len(folder) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
                names += _prefixes(base) if base else []
            else:
                names += absolute(node.module or "")
                base = names[-1]
            names += [f"{base}.{a.name}" if base else a.name for a in node.names]
        deps.update(index[n] for n in names if n in index)
        # modules named by string are imports too: KernelSpec("v41.rmsnorm"), and registry
        # entries named by their entry module, entry_params("rmsnorm")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in (node.value, *(f"{pkg}.{node.value}" for pkg in NAMED_MODULE_PACKAGES)):
                if name in index:
                    deps.add(index[name])
    deps.discard(rel)
    return deps


# packages whose modules are loaded by a bare name at run time (the harness registry
# imports the entry module an entry name refers to)
NAMED_MODULE_PACKAGES = ("harness.entries",)


def reverse_closure(root: Path, seeds: set[str], extra: set[str] = frozenset()) -> set[str]:
    """``seeds`` plus every project file that imports one of them, transitively."""
    files = python_files(root)
    index = {module_name(f): f for f in [*files, *sorted(extra)]}
    rdeps: dict[str, set[str]] = defaultdict(set)
    for f in files:
        try:
            source = (root / f).read_text(errors="replace")
        except OSError:
            continue
        for dep in imports_of(f, source, index):
            rdeps[dep].add(f)
    seen, todo = set(seeds), list(seeds)
    while todo:
        for importer in rdeps.get(todo.pop(), ()):
            if importer not in seen:
                seen.add(importer)
                todo.append(importer)
    return seen


def _git(root: Path, *args: str) -> list[str]:
    p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return [line for line in p.stdout.splitlines() if line]


def changed_files(root: Path, rev: str) -> list[str]:
    """Root-relative paths changed since ``merge-base(rev, HEAD)``, untracked included."""
    try:
        base = _git(root, "merge-base", rev, "HEAD")[0]
    except (subprocess.CalledProcessError, IndexError):
        base = rev
    changed = _git(root, "diff", "--name-only", "--relative", base, "--")
    changed += _git(root, "ls-files", "--others", "--exclude-standard")
    return sorted(set(changed))


def affected(root: Path, rev: str) -> tuple[bool, set[str], list[str]]:
    """``(everything, affected files, changed files)``."""
    try:
        changed = changed_files(root, rev)
    except (subprocess.CalledProcessError, OSError) as e:
        return True, set(), [f"<git failed: {getattr(e, 'stderr', '') or e}>".strip()]
    if any(selects_everything(c) for c in changed):
        return True, set(), changed
    seeds = {c for c in changed if c.endswith(".py")}
    return False, reverse_closure(root, seeds, extra=seeds), changed
