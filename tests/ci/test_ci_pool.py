"""Card leasing: no two running nodes share a card; a hung node's processes all die."""

from __future__ import annotations

import itertools
import json
import random
import signal
import subprocess
import sys
import time

import pytest

from ci.collect import child_env
from ci.pool import CardPool


def test_allocator_leases_disjoint_sets_and_refuses_what_it_lacks():
    pool = CardPool(range(8))
    a, b = pool.allocate(4), pool.allocate(2)
    assert a == [0, 1, 2, 3] and b == [4, 5]
    assert pool.allocate(3) is None          # only 2 left: waits, never over-commits
    assert pool.allocate(9) is None and pool.allocate(0) is None
    pool.release(a)
    assert pool.allocate(3) == [0, 1, 2]    # lowest contiguous run
    with pytest.raises(RuntimeError):
        pool.release([4, 5, 6])               # 6 was never leased
    with pytest.raises(RuntimeError):
        pool.release([42])


def test_allocator_random_lease_release_keeps_leases_disjoint():
    rng = random.Random(3)
    pool = CardPool([0, 1, 2, 3, 6, 7])     # a non-contiguous pool
    leases: list[list[int]] = []
    for _ in range(2000):
        if leases and rng.random() < 0.45:
            pool.release(leases.pop(rng.randrange(len(leases))))
            continue
        n = rng.randint(1, 6)
        got = pool.allocate(n)
        held = sum(map(len, leases))
        if got is None:
            assert n > 6 - held
            continue
        assert len(got) == n == len(set(got)) and set(got) <= set(pool.ids)
        assert all(not set(got) & set(other) for other in leases)
        leases.append(got)
        assert pool.free == set(pool.ids) - set(itertools.chain(*leases))


RECORDING_NODES = '''
MARK
import json, os, time
import pytest

CASES = [(1, 1, 0), (1, 1, 1), (2, 1, 2), (2, 2, 3), (1, 2, 4), (1, 1, 5), (4, 1, 6)]


@pytest.mark.parametrize("tp,dp,k", CASES)
def test_node(tp, dp, k, request):
    dev = request.config.getoption("--device")
    t0 = time.time()
    time.sleep(0.3)
    t1 = time.time()
    with open(os.environ["CARD_RECORD"], "a") as f:
        f.write(json.dumps({"k": k, "dev": dev, "cards": tp * dp, "t0": t0, "t1": t1}) + "\\n")
'''


def test_no_two_running_nodes_hold_the_same_card(project, run_queue, tmp_path, monkeypatch):
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("CARD_RECORD", str(record))
    root = project({"test_cards.py": RECORDING_NODES})
    rc, rows, _ = run_queue(root, "--cards", "4", "--timeout", "60")
    assert rc == 0, rows
    assert len(rows) == 7 and all(r["status"] == "pass" for r in rows.values())
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(s["k"] for s in seen) == list(range(7))
    for s in seen:
        ids = [int(x) for x in s["dev"].split(",")]
        assert len(ids) == len(set(ids)) == s["cards"] and set(ids) <= {0, 1, 2, 3}
    overlapping = 0
    for a, b in itertools.combinations(seen, 2):
        concurrent = a["t0"] < b["t1"] and b["t0"] < a["t1"]
        shared = set(a["dev"].split(",")) & set(b["dev"].split(","))
        assert not (concurrent and shared), (a, b)
        overlapping += concurrent
    assert overlapping >= 1   # the pool really ran nodes side by side


HANGING_NODE = '''
MARK
import os, subprocess, sys, time
from pathlib import Path

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_hang():
    child = subprocess.Popen(SLEEP)                                # same process group
    escaped = subprocess.Popen(SLEEP, start_new_session=True)      # left the group
    Path(os.environ["HANG_PIDS"]).write_text(f"{child.pid} {escaped.pid}")
    time.sleep(120)


def test_quick():
    pass
'''


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_hung_node_and_its_children_are_killed_at_the_timeout(project, run_queue, tmp_path,
                                                              monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("HANG_PIDS", str(pids))
    root = project({"test_hang.py": HANGING_NODE})
    rc, rows, _ = run_queue(root, "--cards", "2", "--timeout", "5", "--kill-grace", "0.5")
    assert rc == 1
    hung, quick = rows["test_hang.py::test_hang"], rows["test_hang.py::test_quick"]
    assert quick["status"] == "pass"
    assert hung["status"] == "timeout" and hung["timeout"] == 1 and hung["rc"] is None
    assert 5 <= hung["seconds"] < 15 and "timeout" in hung["note"]
    child, escaped = (int(p) for p in pids.read_text().split())
    assert not _running(child), "child in the node's process group survived"
    assert not _running(escaped), "setsid grandchild carrying the node token survived"


def test_cancelled_runner_kills_its_running_nodes(project, tmp_path):
    pids = tmp_path / "pids"
    root = project({"test_hang.py": HANGING_NODE})
    runner = subprocess.Popen(
        [sys.executable, "-m", "ci.queue", "test_hang.py::test_hang", "--backend", "local",
         "--timeout", "120", "--kill-grace", "0.5", "--out", str(tmp_path / "o")],
        cwd=root, env=child_env({"HANG_PIDS": str(pids)}), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    runner.send_signal(signal.SIGTERM)           # a cancelled CI job
    assert runner.wait(timeout=30) != 0
    child, escaped = (int(p) for p in pids.read_text().split())
    assert not _running(child) and not _running(escaped)
