"""The Slurm backend against a real single-node Slurm (munged, slurmctld, slurmd).

The cluster (``slurm_cluster.SlurmCluster``: 8 ``npu`` cards backed by placeholder device
files, private ports, a temporary directory) is started once per module and xdist worker.
Synthetic nodes record when they ran, which ``--device`` ids they got and their Slurm job id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ci import collect, slurm
from slurm_cluster import SlurmCluster, missing_binaries

MISSING = missing_binaries()
needs_slurm = pytest.mark.skipif(
    bool(MISSING), reason=f"Slurm/munge binaries absent ({', '.join(MISSING)}): install the "
                          "Debian packages slurmctld slurmd slurm-client munge (.ci/run does)")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    if MISSING:
        pytest.skip(f"Slurm/munge binaries absent ({', '.join(MISSING)})")
    base = Path(tempfile.mkdtemp(prefix="v41-slurm-"))
    c = SlurmCluster(base, tag=os.environ.get("PYTEST_XDIST_WORKER", "main"))
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def on_cluster(cluster, monkeypatch, tmp_path):
    """Slurm clients point at the test cluster; nodes record into ``tmp_path/rec``."""
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("REC", str(tmp_path / "rec"))
    (tmp_path / "rec").mkdir()
    return cluster


def records(tmp_path: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (tmp_path / "rec").glob("*.json")}


def job_record(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("scontrol", "show", "job", "-d", job).stdout


def settled_job_state(cluster: SlurmCluster, job: str, timeout: float = 60.0) -> str:
    """``JobState=... Reason=...`` of ``job`` once Slurm has finished tearing it down:
    ``scontrol`` shows a cancelled job as ``COMPLETING`` until its processes are reaped
    (seen on a loaded machine), so poll until the state is another one or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        state = re.search(r"JobState=\S+ Reason=\S+", job_record(cluster, job))[0]
        if not state.startswith("JobState=COMPLETING ") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


RECORDING = '''
MARK
import json, os, subprocess, time
from pathlib import Path
import pytest


def record(name, request, **extra):
    rec = Path(os.environ["REC"])
    data = {"device": request.config.getoption("--device"), "job": os.environ["SLURM_JOB_ID"],
            "pid": os.getpid(), **extra}
    (rec / f"{name}.json").write_text(json.dumps(data))


def wait_for(path, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and not path.exists():
        time.sleep(0.1)
    return path.exists()
'''


@needs_slurm
def test_two_eight_card_nodes_never_run_at_the_same_time(on_cluster, project, run_queue,
                                                         tmp_path):
    root = project({"test_full.py": RECORDING + '''

@pytest.mark.parametrize("tp", [8])
@pytest.mark.parametrize("name", ["a", "b"])
def test_full(name, tp, request):
    t0 = time.time()
    time.sleep(2)
    record(name, request, t0=t0, t1=time.time())
'''})
    rc, rows, _ = run_queue(root, "--backend", "slurm", "--timeout", "60")
    assert rc == 0, rows
    rec = records(tmp_path)
    assert set(rec) == {"a", "b"}
    a, b = rec["a"], rec["b"]
    assert a["t1"] <= b["t0"] or b["t1"] <= a["t0"], (a, b)   # never overlapping
    assert a["device"] == b["device"] == "0,1,2,3,4,5,6,7"
    assert a["job"] != b["job"]
    for r in rows.values():
        assert r["status"] == "pass" and r["devices"] == "0,1,2,3,4,5,6,7" and r["cards"] == 8


@needs_slurm
def test_two_and_four_card_nodes_run_together_on_the_cards_slurm_allocated(
        on_cluster, project, run_queue, tmp_path):
    # each node waits (bounded) for the other to have started: both pass only if concurrent
    root = project({"test_pair.py": RECORDING + '''

@pytest.mark.parametrize("tp,name,other", [(2, "two", "four"), (4, "four", "two")])
def test_pair(tp, name, other, request):
    rec = Path(os.environ["REC"])
    (rec / f"{name}.started").touch()
    assert wait_for(rec / f"{other}.started", 40), f"{other} never ran alongside {name}"
    job = os.environ["SLURM_JOB_ID"]   # Slurm's record while the job runs (with the IDX)
    record(name, request, slurm=subprocess.run(["scontrol", "show", "job", "-d", job],
                                               capture_output=True, text=True).stdout)
'''})
    rc, rows, _ = run_queue(root, "--backend", "slurm", "--timeout", "90", "--partition",
                            on_cluster.partition, "--account", "ci_acct")
    assert rc == 0, rows
    rec = records(tmp_path)
    two, four = rec["two"]["device"].split(","), rec["four"]["device"].split(",")
    assert len(two) == 2 and len(four) == 4 and not set(two) & set(four)
    for name, tp in (("two", 2), ("four", 4)):
        nodeid = f"test_pair.py::test_pair[{tp}-{name}-{'four' if tp == 2 else 'two'}]"
        job = rec[name]["slurm"]
        # Slurm's own record of the running job: the card indices it allocated, name, limit
        idx = re.search(r"^\s*Nodes=\S+ .*GRES=npu:\d+\(IDX:([0-9,-]+)\)", job, re.M)[1]
        assert rec[name]["device"] == ",".join(
            str(i) for a, _, b in (p.partition("-") for p in idx.split(","))
            for i in range(int(a), int(b or a) + 1)), (idx, rec[name])
        assert re.search(rf"JobName={re.escape(nodeid)}\n", job), job
        assert "TimeLimit=00:02:00" in job and f"TresPerNode=gres:npu:{tp}" in job
        assert f"Partition={on_cluster.partition} " in job and "Account=ci_acct " in job
        assert rows[nodeid]["devices"] == rec[name]["device"]
        assert rows[nodeid]["status"] == "pass"


@needs_slurm
def test_a_hung_node_is_cancelled_by_slurm_and_reported_as_a_timeout(on_cluster, project,
                                                                     run_queue, tmp_path):
    root = project({"test_hang.py": RECORDING + '''

def test_hang(request):
    record("hang", request)
    time.sleep(200)   # bounded: if Slurm never cancelled it, it would end as a pass
'''})
    t0 = time.monotonic()
    rc, rows, _ = run_queue(root, "--backend", "slurm", "--timeout", "5")   # Slurm: 1 minute
    took = time.monotonic() - t0
    assert rc == 1
    [row] = rows.values()
    assert row["status"] == "timeout" and row["timeout"] == 1, row
    job = records(tmp_path)["hang"]["job"]
    assert f"slurm job {job} TIMEOUT: TimeLimit (exit 0:15); JOB {job} ON " in row["note"], row
    assert row["note"].endswith("DUE TO TIME LIMIT"), row
    assert settled_job_state(on_cluster, job) == "JobState=TIMEOUT Reason=TimeLimit"
    # Slurm's limit is whole minutes, checked every ~30 s, against a whole-second start time:
    # the 1-minute job ended after 56.7 s on our clock once; the queue's own 5 s timeout
    # would have ended it after ~5 s
    assert 30 <= took < 300, took
    assert not Path(f"/proc/{records(tmp_path)['hang']['pid']}").exists()


@needs_slurm
def test_exit_zero_without_a_pass_line_fails_the_run(on_cluster, project, run_queue):
    root = project({"test_quiet.py": '''
        MARK
        import os


        def test_ok():
            pass


        def test_exit0_without_pass_line():
            os._exit(0)
        '''})
    rc, rows, _ = run_queue(root, "--backend", "slurm", "--timeout", "60")
    assert rc == 1
    quiet = rows["test_quiet.py::test_exit0_without_pass_line"]
    assert quiet["status"] == "fail" and quiet["rc"] == 0, quiet
    assert "without a pytest summary line" in quiet["note"] and "COMPLETED" in quiet["note"]
    assert rows["test_quiet.py::test_ok"]["status"] == "pass"


@needs_slurm
def test_failed_and_unstartable_jobs_carry_slurms_reason(on_cluster, project, run_queue):
    root = project({"test_bad.py": '''
        MARK
        import os
        import subprocess
        import time
        import pytest


        def test_ok():
            pass


        def test_fails():
            assert 1 == 2


        def test_cancelled_by_slurm():   # e.g. an operator's scancel
            subprocess.run(["scancel", os.environ["SLURM_JOB_ID"]], check=True)
            time.sleep(60)


        @pytest.mark.parametrize("tp", [16])
        def test_too_big(tp):
            pass
        '''})
    rc, rows, _ = run_queue(root, "--backend", "slurm", "--timeout", "60")
    assert rc == 1
    fails, big = rows["test_bad.py::test_fails"], rows["test_bad.py::test_too_big[16]"]
    assert fails["status"] == "fail" and fails["fail"] == 1
    assert re.search(r"slurm job \d+ FAILED: NonZeroExitCode \(exit 1:0\)", fails["note"]), fails
    cancelled = rows["test_bad.py::test_cancelled_by_slurm"]
    assert cancelled["status"] == "fail", cancelled
    assert re.search(r"slurm job \d+ CANCELLED \(exit 0:15\); JOB \d+ ON \S+ CANCELLED AT ",
                     cancelled["note"]), cancelled
    assert big["status"] == "fail" and big["devices"] == ""
    assert "REJECTED" in big["note"] and "Requested node configuration is not available" in \
        big["note"], big


@needs_slurm
def test_a_cancelled_runner_cancels_its_slurm_jobs(on_cluster, project, tmp_path):
    root = project({"test_hang.py": RECORDING + '''

def test_hang(request):
    record("hang", request)
    time.sleep(600)
'''})
    out = tmp_path / "o"
    runner = subprocess.Popen(
        [sys.executable, "-m", "ci.queue", "--backend", "slurm", "--timeout", "600", "--out",
         str(out)], cwd=root, env=collect.child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    rec = tmp_path / "rec" / "hang.json"
    deadline = time.monotonic() + 60
    while not rec.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rec.exists(), runner.kill() or runner.communicate()[0]
    runner.send_signal(signal.SIGTERM)
    text = runner.communicate(timeout=60)[0].decode()
    assert runner.returncode != 0, text
    job = json.loads(rec.read_text())["job"]
    state = settled_job_state(on_cluster, job)
    log = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert state.startswith("JobState=CANCELLED "), (state, text, log)
    [row] = json.loads((out / "results.json").read_text())["nodes"]
    assert row["status"] == "cancelled", row


@needs_slurm
def test_rmsnorm_case_passes_on_the_local_slurm(on_cluster, tmp_path):
    """``python -m ci.queue --backend slurm cases/test_rmsnorm.py`` in this repository."""
    env = collect.child_env()
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    p = subprocess.run([sys.executable, "-m", "ci.queue", "--backend", "slurm", "--timeout",
                        "600", "--out", str(tmp_path / "o"), "cases/test_rmsnorm.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert data["backend"] == "slurm" and data["nodes"]
    assert all(r["status"] == "pass" and r["devices"] for r in data["nodes"]), data["nodes"]


# -- without a cluster -------------------------------------------------------------------

def test_allocated_ids_read_the_gres_indices_of_the_job_record():
    record = ("JobId=7 JobName=x\n   JOB_GRES=gpu:1,npu:3\n"
              "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0),npu:910b:3(IDX:1,4-5)\n"
              "   TresPerNode=gres:npu:3\n")
    assert slurm.allocated_ids(record, "npu") == [1, 4, 5]
    assert slurm.allocated_ids(record, "gpu") == [0]
    assert slurm.allocated_ids(record, "np") is None
    assert slurm.allocated_ids("JobId=7\n   TresPerNode=gres:npu:3\n", "npu") is None


def test_the_launcher_refuses_to_invent_card_ids(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho 'JobId=5 JobName=x'\necho '   Nodes=n1 CPU_IDs=0 Mem=0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    marker = tmp_path / "ran"
    p = subprocess.run([sys.executable, "-m", "ci.slurm", "launch", "--gres", "npu", "--cards",
                        "2", "--", "touch", str(marker)], capture_output=True, text=True,
                       env=collect.child_env())
    assert p.returncode == 3 and "refusing to guess card ids" in p.stdout, p.stdout + p.stderr
    assert not marker.exists()


@pytest.mark.parametrize("args,needle", [
    (["--partition", "p"], "--partition apply only to --backend slurm"),
    (["--backend", "local", "--gres-name", "npu"], "--gres-name apply only to --backend slurm"),
    (["--backend", "slurm", "--gres-name", "npu:8"], "--gres-name: expected a GRES name"),
    (["--backend", "slurm", "--partition", "a b"], "--partition: expected letters"),
    (["--backend", "slurm", "--cards", "4"], "--cards/--devices size the local pool"),
])
def test_bad_slurm_flags_are_refused_before_any_work(args, needle, capsys):
    from ci import queue
    with pytest.raises(SystemExit) as e:
        queue.parse_args(["--list", *args])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_time_limit_is_the_node_timeout_in_whole_minutes():
    assert [slurm.time_limit_minutes(s) for s in (0.5, 60, 61, 900, 3600.5)] == [1, 1, 2, 15, 61]
