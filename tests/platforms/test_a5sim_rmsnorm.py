"""a5sim runs pypto kernels numerically on CPU with A5 cost-model timing (RMSNorm first).

Every launch runs in a worker subprocess; the outputs come from pypto's interpreter of
the compiled kernel (output buffers start as NaN), never from the golden.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from goldens.config import FLASH, TINY
from goldens.norm import rms_norm
from harness.platforms import KernelSpec, PlatformError, get_platform
from harness.platforms.worker import decode_config, encode_config

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RMSNORM = KernelSpec("v41.rmsnorm")
PYPTO_LITTER = ("output", "kernel_meta", "plog", ".pypto", "ascend", "log", "rundata")
ZERO_ROW = 3  # an all-zero row (when tokens > ZERO_ROW): eps keeps it finite


@pytest.fixture(scope="module")
def a5sim():
    platform = get_platform("a5sim")
    ok, why = platform.available()
    if not ok:
        pytest.skip(why)
    yield platform
    root = platform._run_root
    platform.close()
    if root is not None and not platform_keep():
        assert not root.exists(), f"run dir {root} survived close()"


def platform_keep() -> bool:
    from harness.platforms.pypto_env import keep_run_dir
    return keep_run_dir()


def rmsnorm_inputs(config, tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = config.hidden_size
    scale = 10.0 ** torch.randint(-3, 3, (tokens, 1), generator=g)
    x = (torch.randn(tokens, h, generator=g) * scale).to(torch.bfloat16)
    if tokens > ZERO_ROW:
        x[ZERO_ROW] = 0
    w = (1 + 0.5 * torch.randn(h, generator=g)).to(torch.bfloat16)
    y = torch.full((tokens, h), float("nan"), dtype=torch.bfloat16)
    return {"x": x, "weight": w, "y": y}


def row_failures(actual: torch.Tensor, ref: torch.Tensor) -> list[str]:
    """Contract bound per row: RMS(a-r) <= 1e-6 + 0.01 RMS(r), max|a-r| <= 1e-5 + 0.05 RMS(r);
    any non-finite value fails.  Returns one message per failing row."""
    a, r = actual.double(), ref.double()
    bad = []
    for i in range(r.shape[0]):
        rms_r = r[i].square().mean().sqrt().item()
        if not torch.isfinite(a[i]).all():
            bad.append(f"row {i}: {int((~torch.isfinite(a[i])).sum())} non-finite values")
            continue
        d = a[i] - r[i]
        rms_d, max_d = d.square().mean().sqrt().item(), d.abs().max().item()
        if rms_d > 1e-6 + 0.01 * rms_r:
            bad.append(f"row {i}: RMS(a-r) {rms_d:.3g} > {1e-6 + 0.01 * rms_r:.3g}")
        elif max_d > 1e-5 + 0.05 * rms_r:
            bad.append(f"row {i}: max|a-r| {max_d:.3g} > {1e-5 + 0.05 * rms_r:.3g}")
    return bad


def launch_rmsnorm(platform, config, tokens, variant="reference", seed=0):
    spec = RMSNORM if variant == "reference" else KernelSpec("v41.rmsnorm", {"variant": variant})
    program = platform.compile(spec, config, {"tokens": tokens})
    inputs = rmsnorm_inputs(config, tokens, seed)
    result = platform.launch(program, 0, inputs)
    assert result.ok, f"{result.error}\nlog: {result.log_path}"
    ref = rms_norm(inputs["x"], inputs["weight"], config.rms_norm_eps)
    return result, ref


def test_local_check_catches_errors():
    ref = torch.ones(2, 1024)
    assert row_failures(ref.clone(), ref) == []
    assert row_failures(ref * 1.02, ref)[0].startswith("row 0: RMS(a-r) 0.02 >")
    off = ref.clone()
    off[1, 0] = 1.0625  # one spike: RMS fine, max over 0.05
    assert row_failures(off, ref) == ["row 1: max|a-r| 0.0625 > 0.05"]
    off[0, 0] = float("nan")
    assert row_failures(off, ref)[0].startswith("row 0: 1 non-finite")


@pytest.mark.parametrize("config,tokens", [
    (TINY, 1), (TINY, 7), (TINY, 192), (FLASH, 1), (FLASH, 7),
    pytest.param(FLASH, 192, marks=pytest.mark.slow),
], ids=lambda v: getattr(v, "name", v))
def test_rmsnorm_matches_golden(a5sim, config, tokens):
    result, ref = launch_rmsnorm(a5sim, config, tokens)
    y = result.outputs["y"]
    assert y.shape == ref.shape and y.dtype == torch.bfloat16
    assert not torch.isnan(y).any(), "kernel left NaN sentinel values in y"
    assert row_failures(y, ref) == []
    if tokens > ZERO_ROW:
        assert torch.equal(y[ZERO_ROW], torch.zeros_like(y[ZERO_ROW]))
    cost = result.cost
    assert cost is not None and cost.device_arch == "A5"
    assert cost.aicore_e2e_us > 0 and cost.total_cycles > 0
    t = result.timings
    print(f"\n{config.name} T={tokens}: compile {t.get('compile_s')} s, cost model "
          f"{t.get('run_s')} s, worker {t.get('worker_wall_s')} s; A5 estimate "
          f"{cost.aicore_e2e_us} us, {cost.total_cycles} cycles")


@pytest.mark.parametrize("variant", ["no_weight", "half_count", "no_eps"])
def test_wrong_kernel_fails_the_check(a5sim, variant):
    result, ref = launch_rmsnorm(a5sim, TINY, 7, variant=variant)
    failures = row_failures(result.outputs["y"], ref)
    assert failures, f"variant {variant} passed the contract check"
    if variant == "no_eps":  # eps matters only on the all-zero row
        assert failures == [f"row {ZERO_ROW}: {TINY.hidden_size} non-finite values"]


def _tree_state() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines()}


def test_cost_is_deterministic_and_repo_untouched(a5sim):
    before = _tree_state()
    first, _ = launch_rmsnorm(a5sim, TINY, 7, seed=5)
    second, _ = launch_rmsnorm(a5sim, TINY, 7, seed=5)
    assert first.cost == second.cost
    assert torch.equal(first.outputs["y"], second.outputs["y"])
    for r in (first, second):
        assert REPO not in r.run_dir.parents
    # other people edit sources and run hypothesis meanwhile: only tool output is ours
    new = {p for p in _tree_state() - before
           if not p.endswith((".py", ".md", ".toml")) and not p.startswith(".hypothesis/")}
    assert not new, f"launch left files in the repository: {sorted(new)}"
    tool_output = [p for p in _tree_state() if p.split("/")[0] in PYPTO_LITTER
                   or p.startswith("verify_")]
    assert not tool_output, f"pypto output in the repository: {tool_output}"


@pytest.mark.parametrize("mode,why", [
    ("abort", "killed by signal SIGABRT"),
    ("segfault", "killed by signal SIGSEGV"),
    ("raise", "RuntimeError: deliberate failure (raise)"),
])
def test_crashing_launch_is_an_error_result(a5sim, monkeypatch, mode, why):
    monkeypatch.syspath_prepend(str(HERE))
    program = a5sim.compile(KernelSpec("_crash_kernel", {"mode": mode}), TINY, {})
    result = a5sim.launch(program, 0, {"x": torch.zeros(4), "y": torch.zeros(4)})
    assert not result.ok and why in result.error
    assert result.log_path.exists() and result.outputs == {}
    with pytest.raises(PlatformError, match="launch failed"):
        result.raise_for_error()


def test_launch_rejects_mismatched_tensors(a5sim):
    program = a5sim.compile(RMSNORM, TINY, {"tokens": 2})
    inputs = rmsnorm_inputs(TINY, 2)
    with pytest.raises(PlatformError, match=r"x: shape \(3, 256\)"):
        a5sim.launch(program, 0, {**inputs, "x": torch.zeros(3, 256, dtype=torch.bfloat16)})
    with pytest.raises(PlatformError, match="weight: dtype torch.float32"):
        a5sim.launch(program, 0, {**inputs, "weight": inputs["weight"].float()})


def test_config_round_trips_through_json():
    for cfg in (TINY, FLASH):
        assert decode_config(encode_config(cfg)) == cfg


def test_a5_unavailable_names_reason():
    ok, why = get_platform("a5").available()
    if ok:
        pytest.skip("an A5 card is present")
    assert why.startswith("a5: ")


def test_no_pypto_in_the_calling_process():
    """pypto must be imported only by workers (after pypto_env configured them)."""
    code = ("import sys; import harness.platforms as p, harness.platforms.a5sim, "
            "harness.platforms.a5, v41.rmsnorm; print('pypto' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "False"
