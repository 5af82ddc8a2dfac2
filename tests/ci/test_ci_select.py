"""``--changed-since``: the reverse-import closure on a synthetic git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ci import select
from ci.collect import marked_entries

MARK = "# ci: " + "a5"

FILES = {
    "pkg/__init__.py": "",
    "pkg/leaf.py": "VALUE = 1\n",
    "pkg/mid.py": "from pkg.leaf import VALUE\n",
    "pkg/rel.py": "from . import leaf\n",
    "pkg/other.py": "X = 2\n",
    "models/common.py": "Y = 3\n",
    "models/entry_sibling.py": f"{MARK}\nimport common\n",                  # script-style import
    "test_mid.py": f"{MARK}\nimport pkg.mid\n\ndef test_a():\n    pass\n",  # leaf via mid
    "test_rel.py": f"{MARK}\nfrom pkg import rel\n\ndef test_b():\n    pass\n",
    "test_other.py": f"{MARK}\nfrom pkg.other import X\n\ndef test_c():\n    pass\n",
    "tests/helpers.py": "import pkg.leaf\n",                                 # unmarked importer
    "conftest.py": "",
    "README.md": "docs\n",
}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    return root


def selected(root: Path, rev: str = "main") -> set[str] | str:
    everything, hit, _ = select.affected(root, rev)
    return "ALL" if everything else {e for e in marked_entries(root) if e in hit}


def test_leaf_change_selects_transitive_importers_only(repo):
    git(repo, "checkout", "-q", "-b", "pr")
    (repo / "pkg/leaf.py").write_text("VALUE = 2\n")
    git(repo, "commit", "-q", "-am", "change leaf")
    assert selected(repo) == {"test_mid.py", "test_rel.py"}


def test_uncommitted_and_sibling_changes_are_seen(repo):
    (repo / "models/common.py").write_text("Y = 4\n")                  # unstaged
    assert selected(repo, "HEAD") == {"models/entry_sibling.py"}
    (repo / "models/common.py").write_text("Y = 3\n")
    (repo / "pkg/other.py").write_text("X = 5\n")
    assert selected(repo, "HEAD") == {"test_other.py"}


def test_entry_change_selects_itself_and_docs_select_nothing(repo):
    (repo / "README.md").write_text("more docs\n")
    assert selected(repo, "HEAD") == set()
    (repo / "test_rel.py").write_text((repo / "test_rel.py").read_text() + "# edit\n")
    assert selected(repo, "HEAD") == {"test_rel.py"}


@pytest.mark.parametrize("path", ["conftest.py", "ci/queue.py", "pyproject.toml"])
def test_conftest_runner_or_config_change_selects_everything(repo, path):
    (repo / path).parent.mkdir(exist_ok=True)
    (repo / path).write_text("# changed\n")
    assert selected(repo, "HEAD") == "ALL"


def test_unknown_revision_selects_everything(repo):
    assert selected(repo, "no-such-rev") == "ALL"


def test_queue_skips_the_run_when_nothing_is_affected(repo, capsys):
    from ci import queue
    (repo / "README.md").write_text("more docs\n")
    assert queue.main(["--root", str(repo), "--changed-since", "HEAD", "--list"]) == 0
    assert "nothing to run" in capsys.readouterr().out
    (repo / "pkg/other.py").write_text("X = 6\n")
    assert queue.main(["--root", str(repo), "--changed-since", "HEAD", "--list",
                       "--backend", "local"]) == 0
    out = capsys.readouterr().out
    assert "test_other.py::test_c" in out and "test_mid.py" not in out


def test_import_resolution_details():
    index = {"a": "a/__init__.py", "a.b": "a/b.py", "a.b.c": "a/b/c.py", "x": "x.py",
             "a.sib": "a/sib.py"}
    deps = select.imports_of("a/b/c.py", "from .. import sib\nfrom ..b import thing\n", index)
    assert deps == {"a/__init__.py", "a/sib.py", "a/b.py"}
    # a script-style sibling import does not run the folder's __init__
    assert select.imports_of("a/mod.py", "import sib\nimport x\n", index) == {"a/sib.py", "x.py"}
