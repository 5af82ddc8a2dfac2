"""Collection, verdicts (no false greens) and the exit status of a queue run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci import collect, results

MIXED = '''
MARK
import os
import pytest


@pytest.mark.parametrize("tp,dp", [(2, 1)])
def test_ok(tp, dp):
    pass


def test_bad():
    assert 1 == 2


def test_exit0_without_pass_line():
    os._exit(0)


def test_skipped():
    pytest.skip("no card of that kind")


@pytest.mark.parametrize("tp,dp", [(4, 2)])
def test_too_big(tp, dp):
    pass
'''


def test_verdicts_and_a_failing_node_fails_the_run(project, run_queue):
    rc, rows, out = run_queue(project({"test_mixed.py": MIXED}), "--cards", "4")
    assert rc == 1
    status = {k.split("::")[1]: r["status"] for k, r in rows.items()}
    assert status == {"test_ok[2-1]": "pass", "test_bad": "fail",
                      "test_exit0_without_pass_line": "fail", "test_skipped": "skip",
                      "test_too_big[4-2]": "fail"}
    ok = rows["test_mixed.py::test_ok[2-1]"]
    assert ok["cards"] == 2 and len(ok["devices"].split(",")) == 2 and ok["pass"] == 1
    assert rows["test_mixed.py::test_exit0_without_pass_line"]["rc"] == 0
    assert "without a pytest summary" in rows["test_mixed.py::test_exit0_without_pass_line"]["note"]
    assert "needs 8 cards" in rows["test_mixed.py::test_too_big[4-2]"]["note"]
    tsv = (out / "results.tsv").read_text().splitlines()
    assert tsv[0].split("\t") == list(results.COLUMNS) and len(tsv) == 6
    assert all(Path(r["log"]).is_file() for r in rows.values() if "too_big" not in r["node"])


def test_only_passing_nodes_exit_zero_through_the_cli(project, tmp_path):
    root = project({"test_good.py": "MARK\ndef test_a():\n    pass\n\n\ndef test_b():\n    pass\n",
                    "test_unmarked.py": "def test_c():\n    assert False\n"})
    p = subprocess.run([sys.executable, "-m", "ci.queue", "--backend", "local", "--cards", "2",
                        "--out", str(tmp_path / "o")], cwd=root, capture_output=True, text=True,
                       env=collect.child_env())
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert data["entries"] == ["test_good.py"] and data["totals"]["pass"] == 2


@pytest.mark.parametrize("files", [
    {"test_empty.py": "MARK\nX = 1\n"},                       # marked, but no test in it
    {"test_unmarked.py": "def test_a():\n    pass\n"},        # nothing marked at all
    {"test_broken.py": "MARK\nimport no_such_module\n"},      # collection error
], ids=["no-nodes", "no-entries", "collection-error"])
def test_empty_or_broken_collection_fails_the_run(project, run_queue, files):
    rc, rows, _ = run_queue(project(files))
    assert rc == 1
    assert all(r["status"] == "fail" for r in rows.values())


def test_a_run_where_everything_skipped_is_not_green(project, run_queue):
    src = "MARK\nimport pytest\n\n\ndef test_s():\n    pytest.skip('x')\n"
    rc, rows, _ = run_queue(project({"test_skip.py": src}))
    assert rc == 1 and [r["status"] for r in rows.values()] == ["skip"]


@pytest.mark.parametrize("text,rc,status", [
    ("....\n4 passed in 0.12s\n", 0, "pass"),
    ("= 1 failed, 3 passed, 2 warnings in 1.00s =", 1, "fail"),
    ("1 passed in 0.1s\nINTERNALERROR\n", 3, "fail"),
    ("1 passed, 1 error in 0.5s", 1, "fail"),
    ("no tests ran in 0.01s", 5, "fail"),
    ("2 deselected in 0.01s", 5, "fail"),
    ("1 skipped in 0.01s", 0, "skip"),
    ("my test printed: 3 passed\n", 0, "fail"),
    ("", 0, "fail"),
    ("3 passed in 75.23s (0:01:15)", 0, "pass"),
])
def test_classify_requires_a_pytest_pass_line(text, rc, status):
    assert results.classify(rc, text, timed_out=False)["status"] == status


def test_collect_plugin_writes_axes_and_cards(project):
    root = project({"test_axes.py": '''
        MARK
        import pytest


        @pytest.mark.parametrize("tp,dp,shape", [(2, 2, (3, 4)), (4, 1, (1,))])
        def test_tp_dp(tp, dp, shape):
            pass


        @pytest.mark.parametrize("tp,ep,wiring", [(2, 4, "both"), (4, None, "sharded")])
        def test_tp_ep(tp, ep, wiring):
            pass


        def test_single():
            pass
        '''})
    nodes, err = collect.collect_entry("test_axes.py", root)
    assert err is None
    got = {n["nodeid"].split("::")[1]: (n["axes"], n["cards"]) for n in nodes}
    assert got == {
        "test_tp_dp[2-2-shape0]": ({"tp": 2, "dp": 2}, 4),      # tuples are not JSON scalars
        "test_tp_dp[4-1-shape1]": ({"tp": 4, "dp": 1}, 4),
        "test_tp_ep[2-4-both]": ({"tp": 2, "ep": 4, "wiring": "both"}, 4),
        "test_tp_ep[4-None-sharded]": ({"tp": 4, "ep": None, "wiring": "sharded"}, 4),
        "test_single": ({}, 1),
    }
