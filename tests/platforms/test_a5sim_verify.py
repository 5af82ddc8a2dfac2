"""a5sim's verify level: ``V41_VERIFY`` / ``verify=``, the verifier's verdict read from
the pypto log, and a FAILED verdict turned into a failed launch naming the stage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from goldens.config import TINY
from harness import cli, registry
from harness.case import Case
from harness.entries._kernel import run_with, single_launch
from harness.platforms import KernelSpec, PlatformError, get_platform
from harness.platforms.a5sim import VERIFY_LEVELS, A5SimPlatform, verify_level_from_env
from harness.platforms.verify import LOWERED_PASSES, LogCursor, parse_verdicts, summarize

HERE = Path(__file__).resolve().parent
STAMP = "[INFO ] PYPTO(42):2026-12-01 00:54:21.629 [flow_verifier.cpp:62][VERIFY]:"
ERROR = "[ERROR] PYPTO(42):2026-12-01 00:54:21.700 [flow_verifier.cpp:107][VERIFY]:"
FUNC = "TENSOR_default_loop_1_Unroll1_PATH0_hiddenfunc0_5"


def test_level_from_env(monkeypatch):
    monkeypatch.delenv("V41_VERIFY", raising=False)
    assert verify_level_from_env() == "tensor" and VERIFY_LEVELS == ("tensor", "lowered")
    monkeypatch.setenv("V41_VERIFY", "lowered")
    assert verify_level_from_env() == "lowered"
    assert A5SimPlatform().verify_level == "lowered"
    assert get_platform("a5sim", verify="tensor").verify_level == "tensor"
    monkeypatch.setenv("V41_VERIFY", "passes")
    with pytest.raises(PlatformError, match=r"V41_VERIFY: 'passes' is not one of "
                                            r"\('tensor', 'lowered'\)"):
        verify_level_from_env()
    with pytest.raises(PlatformError, match="V41_VERIFY"):
        get_platform("a5sim")
    with pytest.raises(PlatformError, match=r"verify: 'all' is not one of"):
        get_platform("a5sim", verify="all")
    with pytest.raises(PlatformError, match="a5 platform has no pass verifier"):
        get_platform("a5", verify="lowered")
    assert get_platform("a5").verify_level is None


def crafted_log(failing: str | None) -> str:
    lines = [f"{STAMP}tensor_graph Verify NO_COMPARE"]
    for i, name in enumerate(LOWERED_PASSES[:6]):
        result = "FAILED" if name == failing else "PASS"
        head = ERROR + "ErrCode: FB4001! " if result == "FAILED" else STAMP
        lines.append(f"{head}{FUNC}_Pass_{i:02d}_{name} Verify for 1 data view list index 0 "
                     f"result {result}")
        if result == "FAILED":
            lines.append("    Error rtol=0.001000 atol=0.001000 index:1 golden:1 output:0")
    return "\n".join(lines) + "\n"


def test_parse_crafted_log_names_the_failing_pass():
    ok = summarize(parse_verdicts(crafted_log(None)), "lowered")
    assert ok["error"] is None and ok["tensor_graph"] == ["NO_COMPARE"]
    assert ok["passes"] == sorted(LOWERED_PASSES[:6])
    bad = summarize(parse_verdicts(crafted_log("ExpandFunction")), "lowered")
    assert bad["error"].startswith("verify (lowered): pass ExpandFunction changed the values")
    assert bad["failed"] == [f"{FUNC}_Pass_04_ExpandFunction: FAILED"]


def test_parse_tensor_graph_failure_exec_error_and_missing_verdicts():
    text = f"{ERROR}ErrCode: FB4001! tensor_graph Verify for 1 data view list index 0 result FAILED"
    assert summarize(parse_verdicts(text), "tensor")["error"].startswith(
        "verify (tensor): tensor_graph result FAILED")
    text = (f"{STAMP}tensor_graph Verify NO_COMPARE\n{ERROR}ErrCode: FB200F! VerifyPass failed "
            f"for function {FUNC}, pass RemoveAlloc (passIndex: 33, captureIndex: 4): 1, 2")
    error = summarize(parse_verdicts(text), "lowered")["error"]
    assert "could not execute pass RemoveAlloc" in error and "Pass_33_RemoveAlloc" in error
    assert summarize([], "tensor")["error"] == \
        "verify (tensor): the verifier wrote no tensor_graph verdict"
    only_graph = parse_verdicts(f"{STAMP}tensor_graph Verify NO_COMPARE")
    assert summarize(only_graph, "tensor")["error"] is None
    assert summarize(only_graph, "lowered")["error"] == \
        "verify (lowered): the verifier wrote no pass verdict"


def test_log_cursor_reads_only_new_text(tmp_path):
    log = tmp_path / "debug" / "plog" / "pypto-log-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("old line\n")
    cursor = LogCursor(tmp_path)
    with open(log, "a") as fh:
        fh.write("new line\n")
    (log.parent / "pypto-log-2.log").write_text("second file\n")
    assert cursor.read_new() == "new line\nsecond file\n"


def rmsnorm_tensors(tokens=7):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, TINY.hidden_size, generator=g).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(TINY.hidden_size, generator=g)).to(torch.bfloat16)
    return {"x": x, "weight": w, "y": torch.full_like(x, float("nan"))}


def test_lowered_checks_every_pass_and_tensor_checks_none(lowered):
    program = lowered.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 7})
    res = lowered.launch(program, 0, rmsnorm_tensors()).raise_for_error()
    summary = res.details["verify"]
    assert summary["level"] == "lowered" and summary["error"] is None
    assert summary["passes"] == sorted(LOWERED_PASSES)
    assert (res.run_dir / "pypto.log").exists() and not (res.run_dir / "verify").exists()
    tensor = get_platform("a5sim", verify="tensor")
    try:
        res = tensor.launch(tensor.compile(KernelSpec("v41.rmsnorm"), TINY, {"tokens": 7}), 0,
                            rmsnorm_tensors()).raise_for_error()
    finally:
        tensor.close()
    assert res.details["verify"]["passes"] == [] and res.details["verify"]["level"] == "tensor"


@pytest.mark.parametrize("level", VERIFY_LEVELS)
def test_real_failed_verdict_fails_the_launch(monkeypatch, level):
    """A real FB4001 line: the verifier is handed a wrong golden for y."""
    monkeypatch.syspath_prepend(str(HERE))
    platform = get_platform("a5sim", verify=level)
    try:
        program = platform.compile(KernelSpec("_wrong_golden_kernel"), TINY, {"tokens": 7})
        res = platform.launch(program, 0, rmsnorm_tensors())
    finally:
        platform.close()
    assert not res.ok and res.outputs == {}
    assert res.error.startswith(f"verify ({level}): tensor_graph result FAILED"), res.error


def test_real_failed_pass_names_the_pass(monkeypatch, lowered):
    """A real pass-level FB4001 line (a pass outside LOWERED_PASSES, see the kernel module)
    fails the launch and names the pass."""
    monkeypatch.syspath_prepend(str(HERE))
    case = registry.get("gate").matrix[1]
    inputs = registry.get("gate").build_inputs(case.config, case)
    program = lowered.compile(KernelSpec("_late_pass_kernel"), case.config, case)
    res = lowered.launch(program, 0, {a.name: inputs[a.name] for a in program.args})
    assert not res.ok
    assert res.error.startswith("verify (lowered): pass InferParamIndex changed the values"), \
        res.error
    assert "FB4001" in (res.run_dir / "pypto.log").read_text()


def test_wrong_kernel_variant_still_fails_at_lowered(lowered):
    case = Case(entry="rmsnorm", tokens=7)
    verdicts, _, _ = run_with(lowered, case, single_launch("v41.rmsnorm", variant="no_weight"))
    assert any(not v.passed for v in verdicts)


def test_cli_verify_flag_runs_lowered(monkeypatch, tmp_path):
    from harness import runner
    monkeypatch.setenv("V41_VERIFY", "tensor")  # restored after the test
    seen = []
    real = runner.run_case

    def spy(case, **kw):
        result = real(case, **kw)
        seen.append(result)
        return result

    monkeypatch.setattr(runner, "run_case", spy)
    code = cli.main(["run", "rmsnorm", "--tokens", "3", "--verify", "lowered",
                     "--summary", str(tmp_path / "summary.json")])
    assert code == 0
    assert [(r.status, r.verify_level) for r in seen] == [("pass", "lowered")]


def test_pytest_verify_option_sets_env(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["harness.pytest_plugin"]\n')
    (tmp_path / "test_env.py").write_text('import os\n\ndef test_env():\n'
                                          '    assert os.environ["V41_VERIFY"] == "lowered"\n')
    env = {**os.environ, "V41_VERIFY": "tensor"}

    def pytest_run(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *args], cwd=tmp_path, env=env, capture_output=True, text=True)

    assert pytest_run("--verify", "lowered").returncode == 0
    assert pytest_run().returncode == 1  # the option, not the environment, set it
    bad = pytest_run("--verify", "deep")
    assert bad.returncode != 0 and "--verify: invalid choice: 'deep'" in bad.stderr


def test_golden_alt_results_carry_no_verify_level():
    alt = [e for e in registry.entries().values() if e.sut_for("a5sim")[0].startswith("golden-alt")]
    if not alt:
        pytest.skip("every entry has a kernel")
    from harness.runner import run_case
    result = run_case(alt[0].matrix[0])
    assert result.verify_level is None
