"""The task-submit backend against a stand-in queue (``tests/ci/fake_task_submit/``).

The stand-in follows the real npu-taskqueue protocol: ``--device auto --device-num N
--max-time S --timeout W --run CMD``, ``TASK_DEVICE`` exported as physical card ids from its
pool, the daemon's ``[taskqueue] 任务超时 (Ns)`` line at ``--max-time``, a queued task withdrawn
on the client's SIGTERM, and nested submission refused under ``TASKQUEUE_INSIDE=1``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci.collect import child_env

STAND_IN = Path(__file__).parent / "fake_task_submit"
POOL = "0,1,2,3,12,13,14,15"   # physical ids, not 0..N-1: proves ids come from the queue


def _layout_class():
    spec = importlib.util.spec_from_file_location("fake_tq_layout", STAND_IN / "layout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Layout


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Queue:
    """The state of one stand-in queue, as the tests inspect it."""

    def __init__(self, layout, daemon: subprocess.Popen):
        self.q, self.daemon = layout, daemon

    def pending(self) -> list[str]:
        return self.q.ids(self.q.pending)

    def running(self) -> list[str]:
        return self.q.ids(self.q.running)

    def locks(self) -> list[str]:
        return sorted(p.name for p in self.q.locks.iterdir())

    def events(self, ev: str) -> list[dict]:
        return [e for e in self.q.events() if e["ev"] == ev]


@pytest.fixture
def task_queue(tmp_path, monkeypatch):
    """``task_queue(pool)`` starts a stand-in daemon and puts its ``task-submit`` first on PATH."""
    daemons: list[subprocess.Popen] = []

    def start(pool: str = POOL) -> Queue:
        q = _layout_class()(tmp_path / "taskqueue").make(pool)
        bindir = tmp_path / "tq-bin"
        bindir.mkdir()
        exe = bindir / "task-submit"
        exe.write_text(f"#!/bin/sh\nFAKE_TQ_STATE={shlex.quote(str(q.root))} exec "
                       f"{shlex.quote(sys.executable)} {shlex.quote(str(STAND_IN / 'client.py'))}"
                       ' "$@"\n')
        exe.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("TASKQUEUE_INSIDE", raising=False)   # in case pytest runs in a job
        monkeypatch.delenv("TASK_DEVICE", raising=False)
        daemon = subprocess.Popen([sys.executable, str(STAND_IN / "daemon.py"), str(q.root)],
                                  start_new_session=True, stdin=subprocess.DEVNULL)
        daemons.append(daemon)
        wait_for(lambda: (q.root / "daemon.pid").exists(), 60, "the stand-in daemon")
        return Queue(q, daemon)

    yield start
    for daemon in daemons:
        daemon.terminate()   # the daemon kills its own tasks on SIGTERM
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()


RECORDING = '''
MARK
import json, os, time
import pytest


@pytest.mark.parametrize("tp,dp,k", [(1, 1, 0), (2, 1, 1), (2, 2, 2), (1, 1, 3), (1, 2, 4)])
def test_node(tp, dp, k, request):
    dev = request.config.getoption("--device")
    t0 = time.time()
    time.sleep(0.4)
    with open(os.environ["CARD_RECORD"], "a") as f:
        f.write(json.dumps({"k": k, "dev": dev, "cards": tp * dp, "t0": t0,
                            "t1": time.time()}) + "\\n")
'''


def test_devices_the_queue_allocated_are_recorded_and_never_shared(project, run_queue,
                                                                    task_queue, tmp_path,
                                                                    monkeypatch):
    tq = task_queue()
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("CARD_RECORD", str(record))
    rc, rows, out = run_queue(project({"test_cards.py": RECORDING}), "--backend", "task-submit",
                              "--timeout", "60", "--submit-wait", "120")
    assert rc == 0, rows
    seen = {s["k"]: s for s in map(json.loads, record.read_text().splitlines())}
    pool = {int(x) for x in POOL.split(",")}
    for node, r in rows.items():
        k = int(node.split("-")[-1].rstrip("]"))
        assert r["status"] == "pass" and r["devices"], r
        assert r["devices"] == seen[k]["dev"]          # the row holds what the node was given
        ids = [int(x) for x in r["devices"].split(",")]
        assert len(set(ids)) == r["cards"] and set(ids) <= pool
    data = json.loads((out / "results.json").read_text())
    assert data["backend"] == "task-submit"
    assert all(n["devices"] for n in data["nodes"])
    starts = {e["id"]: e for e in tq.events("start")}
    ends = {e["id"]: e for e in tq.events("end")}
    assert len(starts) == len(ends) == 5
    for a, b in itertools.combinations(starts, 2):   # the queue's own view of card holding
        concurrent = starts[a]["t"] < ends[b]["t"] and starts[b]["t"] < ends[a]["t"]
        assert not (concurrent and set(starts[a]["devices"]) & set(starts[b]["devices"]))
    assert tq.pending() == [] and tq.running() == [] and tq.locks() == []


HANGING = '''
MARK
import time


def test_hang():
    time.sleep(60)


def test_quick():
    pass
'''


def test_a_node_killed_at_max_time_is_a_timeout(project, run_queue, task_queue, capsys):
    tq = task_queue()
    rc, rows, out = run_queue(project({"test_hang.py": HANGING}), "--backend", "task-submit",
                              "--timeout", "2", "--submit-wait", "60")
    assert rc == 1
    hung, quick = rows["test_hang.py::test_hang"], rows["test_hang.py::test_quick"]
    assert quick["status"] == "pass" and quick["devices"]
    assert hung["status"] == "timeout" and hung["timeout"] == 1, hung
    assert "--max-time 2" in hung["note"] and hung["devices"], hung
    assert json.loads((out / "results.json").read_text())["totals"]["timeout"] == 1
    assert "1 timeout" in capsys.readouterr().out
    [end] = [e for e in tq.events("end") if e["timed_out"]]
    assert ",".join(map(str, end["devices"])) == hung["devices"]


SLOW = '''
MARK
import time


def test_a_slow():
    time.sleep(30)


def test_b_slow():
    time.sleep(30)
'''


def test_client_wait_running_out_is_a_timeout_and_leaves_nothing_queued(project, run_queue,
                                                                       task_queue):
    tq = task_queue(pool="5")   # one card: one node runs, the other waits in the queue
    rc, rows, _ = run_queue(project({"test_slow.py": SLOW}), "--backend", "task-submit",
                            "--timeout", "60", "--submit-wait", "3", "--jobs", "2")
    assert rc == 1
    assert {r["status"] for r in rows.values()} == {"timeout"}, rows
    notes = sorted(r["note"] for r in rows.values())
    assert all("--submit-wait 3" in n for n in notes), notes
    ran = [r for r in rows.values() if r["devices"]]
    queued = [r for r in rows.values() if not r["devices"]]
    assert len(ran) == len(queued) == 1
    assert ran[0]["devices"] == "5" and "withdrawn" in queued[0]["note"]
    assert tq.pending() == [] and len(tq.events("withdrawn")) == 1
    wait_for(lambda: not tq.running(), 15, "the abandoned node to be killed")
    assert tq.locks() == [] and len(tq.events("start")) == 1


PAIRS = '''
MARK
import os, time
from pathlib import Path
import pytest


@pytest.mark.parametrize("tp,k", [(2, 0), (2, 1), (2, 2)])
def test_pair(tp, k):
    Path(os.environ["STARTED"], str(k)).touch()
    time.sleep(60)
'''


def test_cancelled_runner_withdraws_its_queued_nodes(project, task_queue, tmp_path):
    tq = task_queue(pool="0,1")   # room for one 2-card node; the other two queue
    started = tmp_path / "started"
    started.mkdir()
    root = project({"test_pairs.py": PAIRS})
    out = tmp_path / "o"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ci.queue", "--backend", "task-submit", "--timeout", "120",
         "--submit-wait", "300", "--kill-grace", "3", "--out", str(out)],
        cwd=root, env=child_env({"STARTED": str(started)}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(tq.running()) == 1 and len(tq.pending()) == 2, 60,
                 "one node running and two queued")
        wait_for(lambda: list(started.iterdir()), 30, "the running node's pytest")
        runner.send_signal(signal.SIGTERM)   # a cancelled CI job
        output, _ = runner.communicate(timeout=40)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 143, output
    assert tq.pending() == [], "queued nodes left behind in the queue"
    wait_for(lambda: not tq.running(), 15, "the running node to be killed")
    time.sleep(1.0)   # the card is free again: nothing queued may start now
    assert len(tq.events("start")) == 1 and len(tq.events("withdrawn")) == 2
    assert len(list(started.iterdir())) == 1 and tq.locks() == []
    data = json.loads((out / "results.json").read_text())
    assert data["cancelled"] is True and data["exit"] == 1
    notes = sorted(n["note"] for n in data["nodes"])
    assert [n["status"] for n in data["nodes"]] == ["cancelled"] * 3
    assert sum("withdrawn from the task-submit queue" in n for n in notes) == 2, notes
    assert sum("killed while running" in n for n in notes) == 1, notes


def test_inside_a_task_submit_job_auto_runs_locally_on_the_job_cards(project, run_queue,
                                                                       task_queue, tmp_path,
                                                                       monkeypatch):
    tq = task_queue()
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("CARD_RECORD", str(record))
    monkeypatch.setenv("TASKQUEUE_INSIDE", "1")
    monkeypatch.setenv("TASK_DEVICE", "12,13,14,15")
    rc, rows, out = run_queue(project({"test_cards.py": RECORDING}), "--backend", "auto",
                              "--timeout", "60")
    assert rc == 0, rows
    assert json.loads((out / "results.json").read_text())["backend"] == "local"
    for r in rows.values():
        assert {int(x) for x in r["devices"].split(",")} <= {12, 13, 14, 15}, r
    assert tq.events("submit") == []   # nothing went to the queue


def test_inside_a_task_submit_job_the_queue_backend_is_refused(project, task_queue, tmp_path,
                                                              monkeypatch):
    from ci import queue
    task_queue()
    root = project({"test_quick.py": "MARK\ndef test_a():\n    pass\n"})
    monkeypatch.setenv("TASKQUEUE_INSIDE", "1")
    monkeypatch.setenv("TASK_DEVICE", "3")
    with pytest.raises(SystemExit) as e:
        queue.main(["--root", str(root), "--out", str(tmp_path / "o"), "--backend",
                    "task-submit"])
    assert "TASKQUEUE_INSIDE" in str(e.value.code) and "nested" in str(e.value.code)
    monkeypatch.delenv("TASK_DEVICE")   # a job that holds no card: auto has nothing to run on
    with pytest.raises(SystemExit) as e:
        queue.main(["--root", str(root), "--out", str(tmp_path / "o"), "--backend", "auto"])
    assert "TASK_DEVICE" in str(e.value.code)


TWO_QUICK = '''
MARK
import time


def test_a():
    time.sleep(1.5)


def test_b():
    time.sleep(1.5)
'''


def test_queue_wait_and_run_time_are_reported_apart(project, run_queue, task_queue):
    tq = task_queue(pool="7")   # one card: the second node waits for the first
    rc, rows, out = run_queue(project({"test_two.py": TWO_QUICK}), "--backend", "task-submit",
                              "--timeout", "60", "--submit-wait", "120", "--jobs", "2")
    assert rc == 0, rows
    submit = {e["id"]: e["t"] for e in tq.events("submit")}
    start = {e["id"]: e["t"] for e in tq.events("start")}
    end = {e["id"]: e["t"] for e in tq.events("end")}
    for r in rows.values():   # the queue's own clock is the reference
        task = re.search(r"task_\w+", Path(r["log"]).read_text())[0]
        # the runner's clocks start a little earlier (client start-up) and end a little later
        assert -0.5 < r["queued"] - (start[task] - submit[task]) < 2.0, (r, task)
        assert -0.5 < r["seconds"] - (end[task] - start[task]) < 2.0, (r, task)
    waited = max(rows.values(), key=lambda r: r["queued"])
    assert waited["queued"] >= 1.5 and waited["seconds"] >= 1.5, rows   # both, apart
    tsv = (out / "results.tsv").read_text().splitlines()[0].split("\t")
    assert tsv[:5] == ["node", "cards", "devices", "queued", "seconds"]


def test_the_clients_own_refusal_is_the_note(project, run_queue, task_queue):
    task_queue()
    src = ("MARK\nimport pytest\n\n\n@pytest.mark.parametrize('tp,dp', [(4, 4)])\n"
           "def test_big(tp, dp):\n    pass\n")
    rc, rows, _ = run_queue(project({"test_big.py": src}), "--backend", "task-submit")
    [row] = rows.values()
    assert rc == 1 and row["status"] == "fail" and row["cards"] == 16
    assert "请求 16 张卡" in row["note"] and "task-submit refused" in row["note"], row


def test_sub_second_limits_round_up_never_to_zero():
    from ci.submit import TaskSubmitBackend
    node = {"nodeid": "t.py::test_a", "axes": {}, "cards": 1}
    argv = TaskSubmitBackend(Path("/r"), timeout=0.5, wait=2.2).argv(node)
    assert argv[argv.index("--max-time") + 1] == "1"
    assert argv[argv.index("--timeout") + 1] == "3"
