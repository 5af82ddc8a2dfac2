"""Backends and modes: the exact task-submit command line, the node command, the sweep."""

from __future__ import annotations

import json
import os
import sys

FAKE_TASK_SUBMIT = '''#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_TS_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
n = int(argv[argv.index("--device-num") + 1])
env = dict(os.environ, TASK_DEVICE=",".join(str(10 + i) for i in range(n)))
sys.exit(subprocess.call(["bash", "-c", argv[argv.index("--run") + 1]], env=env))
'''


def test_task_submit_backend_builds_the_exact_command(project, run_queue, tmp_path,
                                                      monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "task-submit"
    fake.write_text(FAKE_TASK_SUBMIT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TS_LOG", str(tmp_path / "argv.jsonl"))
    root = project({"test_ts.py": '''
        MARK
        import pytest


        @pytest.mark.parametrize("tp,ep", [(2, 4)])
        def test_moe(tp, ep, request):
            assert request.config.getoption("--device") == "10,11,12,13"
        '''})
    rc, rows, _ = run_queue(root, "--backend", "auto", "--timeout", "120", "--submit-wait", "600")
    assert rc == 0, rows
    [argv] = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    run = ('echo "ci.queue: start $(date +%s.%N) cards '
           '${TASK_DEVICE:?task-submit exported no TASK_DEVICE}" && '
           f"cd {root} && {sys.executable} -m pytest 'test_ts.py::test_moe[2-4]' "
           f'-p no:cacheprovider -q --tp 2 --ep 4 --device "$TASK_DEVICE"')
    assert argv == ["--device", "auto", "--device-num", "4", "--max-time", "120",
                    "--timeout", "600", "--run", run]
    assert rows["test_ts.py::test_moe[2-4]"]["status"] == "pass"
    assert rows["test_ts.py::test_moe[2-4]"]["devices"] == "10,11,12,13"


SWEEP_ENTRY = '''
MARK
import argparse, json, os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-p", default="a5sim")
    p.add_argument("--tp", type=int, choices=[1, 4], default=1)
    p.add_argument("--dp", type=int, choices=[1, 2], default=1)
    p.add_argument("-d", required=True)
    a = p.parse_args()
    with open(os.environ["SWEEP_LOG"], "a") as f:
        f.write(json.dumps([a.p, a.tp, a.dp, a.d]) + "\\n")
    raise SystemExit(1 if (a.tp, a.dp) == (4, 2) else 0)


if __name__ == "__" + "main__":
    main()
'''


def test_sweep_runs_the_full_cli_matrix(project, run_queue, tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_LOG", str(tmp_path / "sweep.jsonl"))
    rc, rows, _ = run_queue(project({"entry.py": SWEEP_ENTRY}), "--sweep", "--cards", "8")
    assert rc == 1   # tp4 x dp2 exits 1
    assert {k: r["status"] for k, r in rows.items()} == {
        "entry.py[tp=1,dp=1]": "pass", "entry.py[tp=1,dp=2]": "pass",
        "entry.py[tp=4,dp=1]": "pass", "entry.py[tp=4,dp=2]": "fail"}
    calls = [json.loads(x) for x in (tmp_path / "sweep.jsonl").read_text().splitlines()]
    assert sorted((tp, dp, len(d.split(","))) for _, tp, dp, d in calls) == [
        (1, 1, 1), (1, 2, 2), (4, 1, 4), (4, 2, 8)]
    assert {p for p, *_ in calls} == {"a5"}


def test_node_command_passes_only_the_axes_a_node_has():
    from ci.submit import node_argv
    node = {"nodeid": "v41/x.py::test_precision[4-None]", "axes": {"tp": 4, "ep": None,
                                                                  "tokens": 8}, "cards": 4}
    assert node_argv(node, "py", "0,1,2,3") == [
        "py", "-m", "pytest", "v41/x.py::test_precision[4-None]", "-p", "no:cacheprovider",
        "-q", "--tp", "4", "--device", "0,1,2,3"]
    node["args"] = ["--platform", "a5"]
    assert node_argv(node, "py", "5")[-4:] == ["--platform", "a5", "--device", "5"]
