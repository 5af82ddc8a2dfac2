"""a5sim's launch worker: reused across launches (pypto loaded once, built kernels cached),
replaced after ``V41_WORKER_JOBS`` launches or a failure, and never outliving the process
that started it (SIGTERM, SIGINT, SIGKILL), with its run folder removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from goldens.config import TINY
from harness.platforms import KernelSpec, get_platform
from harness.platforms.worker import max_jobs_from_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def rms_tensors(tokens=5):
    x = torch.randn(tokens, TINY.hidden_size).to(torch.bfloat16)
    return {"x": x, "weight": torch.ones(TINY.hidden_size, dtype=torch.bfloat16),
            "y": torch.full_like(x, float("nan"))}


def test_worker_is_reused_then_recycled(monkeypatch):
    monkeypatch.setenv("V41_WORKER_JOBS", "2")
    platform = get_platform("a5sim")
    try:
        program = platform.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 5})
        runs = [platform.launch(program, 0, rms_tensors()).raise_for_error() for _ in range(3)]
    finally:
        platform.close()
    d = [r.details for r in runs]
    assert d[0]["worker_pid"] == d[1]["worker_pid"] != d[2]["worker_pid"]
    assert [x["worker_job"] for x in d] == [1, 2, 1]
    assert [x["kernel_cached"] for x in d] == [False, True, False]
    assert "setup_s" in runs[0].timings and "setup_s" not in runs[1].timings
    assert not torch.isnan(runs[1].outputs["y"]).any()


def test_failed_launch_replaces_the_worker(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    platform = get_platform("a5sim")
    try:
        good = platform.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 5})
        first = platform.launch(good, 0, rms_tensors()).raise_for_error()
        bad = platform.compile(KernelSpec("_crash_kernel", {"mode": "raise"}), TINY, {})
        failed = platform.launch(bad, 0, {"x": torch.zeros(4), "y": torch.zeros(4)})
        after = platform.launch(good, 0, rms_tensors()).raise_for_error()
    finally:
        platform.close()
    assert not failed.ok and failed.details["worker_pid"] == first.details["worker_pid"]
    assert after.details["worker_pid"] != first.details["worker_pid"]


def test_timed_out_launch_kills_the_worker(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    platform = get_platform("a5sim", timeout_s=20)
    try:
        slow = platform.compile(KernelSpec("_crash_kernel", {"mode": "sleep"}), TINY, {})
        hung = platform.launch(slow, 0, {"x": torch.zeros(4), "y": torch.zeros(4)})
        root = str(platform.run_root)
        gone = _wait_until(lambda: not _processes_mentioning(root), 10)
        good = platform.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 5})
        after = platform.launch(good, 0, rms_tensors()).raise_for_error()
    finally:
        platform.close()
    assert not hung.ok and hung.error.startswith("worker timed out after 20 s")
    assert gone, "the timed-out worker is still running"
    assert after.details["worker_job"] == 1


def test_worker_jobs_env_is_checked(monkeypatch):
    monkeypatch.setenv("V41_WORKER_JOBS", "0")
    with pytest.raises(ValueError, match=r"V41_WORKER_JOBS: '0' must be an int >= 1"):
        max_jobs_from_env()


PARENT = {"platform": """
import signal, sys, torch
# Ctrl-C's default even when the test run itself was started in the background (a shell then
# starts it with SIGINT ignored, and the parent would never see the signal)
signal.signal(signal.SIGINT, signal.default_int_handler)
from goldens.config import TINY
from harness.platforms import KernelSpec, get_platform
sys.path.insert(0, {here!r})
p = get_platform("a5sim")
prog = p.compile(KernelSpec("_crash_kernel", {{"mode": "sleep"}}), TINY, {{}})
p.launch(prog, 0, {{"x": torch.zeros(4), "y": torch.zeros(4)}})
""", "cli": """
import sys, torch
sys.path.insert(0, {here!r})
from harness import cli, registry
from harness.case import Case, Support
from harness.entries._kernel import single_launch
registry.register(registry.Entry(
    name="slow_probe", description="a launch that sleeps", support=Support(),
    matrix=(Case(entry="slow_probe"),),
    build_inputs=lambda cfg, case: {{"x": torch.zeros(4), "y": torch.zeros(4)}},
    golden=lambda cfg, case, inputs: inputs, compare=lambda *a: [],
    kernels={{"a5sim": single_launch("_crash_kernel", mode="sleep")}}))
cli.main(["run", "slow_probe", "--summary", {summary!r}])
"""}


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def _wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("launcher,sig", [
    ("platform", signal.SIGTERM), ("platform", signal.SIGINT), ("platform", signal.SIGKILL),
    ("cli", signal.SIGTERM), ("cli", signal.SIGKILL),
], ids=lambda v: getattr(v, "name", v))
def test_worker_dies_with_its_parent(tmp_path, launcher, sig):
    """The parent (a script on the platform, or ``python -m harness run``'s main) is killed
    mid-launch; the worker and the run folder (under ``V41_RUN_DIR``) must go away."""
    runs = tmp_path / "runs"
    code = PARENT[launcher].format(here=str(HERE), summary=str(tmp_path / "summary.json"))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                              env={**os.environ, "V41_RUN_DIR": str(runs)})
    try:
        # the worker is up and inside the slow launch: its job folder's log exists
        assert _wait_until(lambda: any(runs.glob("*/launch-*/worker.log"))
                           and _processes_mentioning(str(runs)), 90), "worker never started"
        workers = _processes_mentioning(str(runs))
        parent.send_signal(sig)
        parent.wait(timeout=30)
        assert _wait_until(lambda: not _processes_mentioning(str(runs)), 30), \
            f"worker(s) {workers} outlived the parent ({sig.name})"
        assert _wait_until(lambda: not any(runs.iterdir()), 30), \
            f"run folder(s) {list(runs.iterdir())} survived the parent ({sig.name})"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
