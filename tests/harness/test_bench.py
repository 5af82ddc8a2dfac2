"""Bench roofline arithmetic, declared work, case selection, JSON rows and name errors.

Launch-free: the one test of ``main`` replaces the runner with a fixed result.
"""

import json

import pytest

from harness import bench, registry
from harness.bench import bench_cases, case_work, check_names, roofline
from harness.case import Case
from harness.platforms import topology
from harness.registry import Work, tensor_bytes
from harness.runner import CaseResult

PLAT = topology.read_platform()


def kernel_entries():
    return [n for n, e in registry.entries().items() if "a5sim" in e.kernels]


def test_roofline_takes_the_binding_resource():
    one_s_of_hbm = int(PLAT.hbm_bytes_per_s)
    mem = roofline(Work(one_s_of_hbm), PLAT)
    assert mem.us == pytest.approx(1e6) and mem.bound == "memory"
    bf16_2s = int(2 * PLAT.peaks["bf16"])
    both = roofline(Work(one_s_of_hbm, {"bf16": bf16_2s}), PLAT)
    assert both.us == pytest.approx(2e6) and both.bound == "compute"


def test_fp32_matmul_is_rated_against_the_fp32_peak():
    # the platform file's FP32 fractal (DT_FLOAT=16,8,16) does half the MACs of BF16's
    # (Default=16,16,16) per cycle: the same FLOPs take twice as long in FP32
    f = 10**12
    fp32 = roofline(Work(0, {"fp32": f}), PLAT).compute_us
    bf16 = roofline(Work(0, {"bf16": f}), PLAT).compute_us
    assert fp32 == pytest.approx(2 * bf16)
    assert fp32 == pytest.approx(f / PLAT.peaks["fp32"] * 1e6)
    # gate's router matmul is FP32 x FP32: declared as fp32 work, not bf16
    case = Case(entry="gate", tokens=7, preset="flash")
    w = case_work(registry.get("gate"), case)
    cfg = case.config
    assert w.flops["fp32"] == 2 * 7 * cfg.hidden_size * cfg.moe.n_routed_experts
    assert "bf16" not in w.flops


def test_cube_dtypes_share_the_cube_and_the_vector_unit_overlaps():
    f = 10**12
    cube = roofline(Work(0, {"bf16": f, "fp32": f}), PLAT).compute_us
    assert cube == pytest.approx((f / PLAT.peaks["bf16"] + f / PLAT.peaks["fp32"]) * 1e6)
    vec = f / PLAT.peaks["vector_fp32"] * 1e6
    mixed = roofline(Work(0, {"bf16": f, "vector_fp32": f}), PLAT).compute_us
    assert mixed == pytest.approx(max(f / PLAT.peaks["bf16"] * 1e6, vec))


def test_unknown_flop_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="'int4'"):
        roofline(Work(0, {"int4": 1}), PLAT)


def test_rmsnorm_bytes_are_its_abi_tensors():
    w = case_work(registry.get("rmsnorm"), Case(entry="rmsnorm", tokens=10, preset="flash"))
    assert w.bytes == (10 * 5120 * 2) * 2 + 5120 * 2
    assert set(w.flops) == {"vector_fp32"}


def test_every_kernel_entry_declares_rateable_work():
    for name in kernel_entries():
        entry = registry.get(name)
        assert entry.work is not None, name
        for case in entry.matrix:
            w = case_work(entry, case)
            assert w.bytes > 0 and all(v >= 0 for v in w.flops.values()), case.case_id
            roofline(w, PLAT)  # every declared dtype has a peak


def _rope(capacity_factor: int = 1, all_identity: bool = False):
    entry = registry.get("rope_rows")
    case = Case(entry="rope_rows", tokens=192, active_tokens=150, preset="flash")
    inputs = entry.build_inputs(case.config, case)
    if capacity_factor > 1:  # a bigger table, same positions
        for k in ("freqs_cos", "freqs_sin"):
            inputs[k] = inputs[k].repeat(capacity_factor, 1)
    if all_identity:
        inputs["position_ids"][:150] = -1
    return entry.work(case.config, case, inputs), inputs


def test_rope_rows_bytes_follow_the_gathered_rows_not_the_table():
    w, inputs = _rope()
    assert w.bytes < tensor_bytes(inputs["freqs_cos"]) / 10  # the table is 2.1 MB
    assert _rope(capacity_factor=4)[0].bytes == w.bytes
    gathered = int((inputs["position_ids"][:150] >= 0).sum())
    row = 2 * inputs["freqs_cos"].shape[1] * 4  # one cos and one sin FP32 row
    assert 0 < gathered < 150
    assert w.bytes - _rope(all_identity=True)[0].bytes == gathered * row


def _sparse(blocks_factor: int = 1, drop_token: int | None = None):
    entry = registry.get("sparse_attention")
    case = Case(entry="sparse_attention", tokens=48, tp=4, preset="flash")
    inputs = entry.build_inputs(case.config, case)
    if blocks_factor > 1:  # a bigger cache, same row ids
        for k in ("window_kv", "window_kv_scale"):
            inputs[k] = inputs[k].repeat(blocks_factor, 1, 1, 1)
    if drop_token is not None:
        inputs["indices"][drop_token] = -1
    return entry.work(case.config, case, inputs), inputs


def test_sparse_attention_bytes_follow_the_gathered_rows():
    w, inputs = _sparse()
    idx = inputs["indices"]
    d, g = inputs["window_kv"].shape[-1], inputs["window_kv_scale"].shape[-1]
    assert _sparse(blocks_factor=3)[0].bytes == w.bytes
    # every valid id of every token is a gather (row ids repeat across tokens)
    n_valid = int((idx >= 0).sum())
    assert n_valid > idx.shape[0] and len(set(idx[idx >= 0].tolist())) < n_valid
    t = 0
    valid_t = int((idx[t] >= 0).sum())
    dropped, _ = _sparse(drop_token=t)
    assert w.bytes - dropped.bytes == valid_t * (d + g)
    heads = inputs["q"].shape[1]
    assert w.flops["bf16"] - dropped.flops["bf16"] == 4 * heads * valid_t * d
    # the gathered rows dominate: more than the whole 0.5 MB cache, far more than q + out
    assert w.bytes > tensor_bytes(inputs["window_kv"], inputs["window_kv_scale"])


def test_bench_selects_kernel_entries_and_shapes():
    cases = bench_cases(["rmsnorm"], "flash", [1, 192])
    assert [(c.preset, c.tokens) for c in cases] == [("flash", 1), ("flash", 192)]
    assert all(registry.get(c.entry).kernels for c in bench_cases([], None, None))


def test_unknown_entry_is_not_registered_with_close_matches(capsys):
    assert check_names(["rmsnorm"]) is None
    assert bench.main(["rmsnrm"]) == 2
    err = capsys.readouterr().err
    assert "'rmsnrm' is not registered" in err and "did you mean rmsnorm" in err
    assert bench.main(["bogus"]) == 2
    assert "'bogus' is not registered" in capsys.readouterr().err


def test_entry_without_kernel_says_no_kernel_yet(capsys):
    assert registry.get("golden_alt_prefill_attn_swa").kernels == {}
    assert bench.main(["golden_alt_prefill_attn_swa"]) == 2
    assert "'golden_alt_prefill_attn_swa' has no kernel yet" in capsys.readouterr().err


def test_bad_tokens_refused_before_any_work(capsys):
    assert bench.main(["rmsnorm", "--tokens", "0"]) == 2
    assert "--tokens 0 must be >= 1" in capsys.readouterr().err


def test_json_rows_are_complete_and_consistent(monkeypatch, capsys):
    est = {"rmsnorm": 7.5, "gate": 3.0}

    def fake_run(case, *a, **k):
        r = CaseResult(case=case, sut="kernel:x", status="pass",
                       costs=[{"rank": 0, "aicore_e2e_us": est[case.entry], "total_cycles": 1}])
        r.verify_level = "tensor"
        return r

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    assert bench.main(["--json", "rmsnorm", "gate", "--preset", "flash", "--tokens", "192"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["entry"] for r in rows] == ["gate", "rmsnorm"]
    desc = topology.describe()
    for r in rows:
        for key in ("entry", "case", "estimated_us", "roofline_us", "ratio", "bytes", "flops",
                    "bound", "verify_level", "topology"):
            assert key in r, key
        assert r["estimated_us"] == est[r["entry"]] and r["verify_level"] == "tensor"
        assert r["ratio"] == pytest.approx(r["estimated_us"] / r["roofline_us"])
        assert r["roofline_us"] == pytest.approx(max(r["memory_us"], r["compute_us"]))
        assert r["bound"] == ("memory" if r["memory_us"] >= r["compute_us"] else "compute")
        assert r["memory_us"] == pytest.approx(r["bytes"] / PLAT.hbm_bytes_per_s * 1e6)
        assert (r["topology"]["cube_cores"], r["topology"]["vector_cores"],
                r["topology"]["clock_mhz"]) == (desc["cube_cores"], desc["vector_cores"],
                                                desc["clock_mhz"])
    assert {r["bound"] for r in rows} == {"memory"}  # both move far more than they compute


def test_json_bound_follows_the_larger_term(monkeypatch, capsys):
    from harness.case import Support
    from harness.registry import Entry

    def fake_run(case, *a, **k):
        return CaseResult(case=case, sut="kernel:x", status="pass",
                          costs=[{"rank": 0, "aicore_e2e_us": 50.0, "total_cycles": 1}])

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    flops = int(10 * PLAT.peaks["fp32"] / 1e6)  # 10 us of FP32 cube work, 1 byte moved
    heavy = Entry(name="zz_compute_heavy", description="test", support=Support(phase="prefill"),
                  matrix=(Case(entry="zz_compute_heavy", tokens=1),),
                  build_inputs=lambda cfg, case: {}, golden=None, compare=None,
                  kernels={"a5sim": None}, work=lambda cfg, case, inputs: Work(1, {"fp32": flops}))
    with registry.registered(heavy):
        assert bench.main(["--json", "zz_compute_heavy"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["bound"] == "compute" and row["compute_us"] == pytest.approx(10.0)
    assert row["roofline_us"] == pytest.approx(10.0) and row["ratio"] == pytest.approx(5.0)
    assert row["verify_level"] is None  # the fake result has no verify level


def test_estimate_only_runs_on_a_cost_level_platform_and_says_so(monkeypatch, capsys):
    seen = []

    def fake_run(case, *a, platform=None, **k):
        seen.append((platform.estimate_only, platform.verify_level))
        r = CaseResult(case=case, sut="kernel:x", status="estimate",
                       costs=[{"rank": 0, "aicore_e2e_us": 4.0, "total_cycles": 1}])
        r.verify_level = platform.verify_level
        return r

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    assert bench.main(["--json", "--estimate-only", "rmsnorm", "--tokens", "4"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert seen == [(True, "cost")]
    assert row["status"] == "estimate" and row["verify_level"] == "cost"
    assert row["estimated_us"] == 4.0


def test_an_estimate_is_not_a_pass_without_estimate_only(monkeypatch, capsys):
    def fake_run(case, *a, **k):
        return CaseResult(case=case, sut="kernel:x", status="estimate",
                          costs=[{"rank": 0, "aicore_e2e_us": 4.0, "total_cycles": 1}])

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    assert bench.main(["--json", "rmsnorm", "--tokens", "4"]) == 1


PASS_FAILURE = """LaunchError: launch failed: Traceback (most recent call last):
  File "parser.py", line 131, in wrapper
RuntimeError: Errcode: FFFFFF!
Run pass failed., func CompileFunction, file host_machine.cpp, line 179
libc.so.6(+0x891f5) [0x7f12578a71f5]
 (log: /tmp/run/launch-0001-sparse_attention-rank0/worker.log)
"""


def test_short_reason_keeps_the_error_line_its_detail_and_the_log():
    assert bench.short_reason(PASS_FAILURE) == (
        "RuntimeError: Errcode: FFFFFF! Run pass failed., func CompileFunction, file "
        "host_machine.cpp, line 179 (log: /tmp/run/launch-0001-sparse_attention-rank0/"
        "worker.log)")
    assert bench.short_reason("cost model only: nothing compared") == (
        "cost model only: nothing compared")
    assert bench.short_reason("") is None


def test_an_error_row_says_why_in_json_and_under_the_table(monkeypatch, capsys):
    def fake_run(case, *a, **k):
        return CaseResult(case=case, sut="kernel:x", status="error", reason=PASS_FAILURE)

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    assert bench.main(["--json", "rmsnorm", "--preset", "tiny"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(r["status"] == "error" and "Run pass failed" in r["reason"]
                        for r in rows)
    assert bench.main(["rmsnorm", "--preset", "tiny"]) == 1
    out = capsys.readouterr().out
    assert f"{rows[0]['case']}: error: RuntimeError: Errcode: FFFFFF! Run pass failed." in out


def test_rows_carry_the_slowest_ranks_compile_seconds_and_tasks(monkeypatch, capsys):
    def fake_run(case, *a, **k):
        r = CaseResult(case=case, sut="kernel:x", status="pass", costs=[
            {"rank": 0, "aicore_e2e_us": 5.0, "total_cycles": 9, "tasks": 120, "compile_s": 1.5,
             "compile_cpu_s": 1.25},
            {"rank": 1, "aicore_e2e_us": 6.0, "total_cycles": 9, "tasks": 80, "compile_s": 2.25,
             "compile_cpu_s": 1.0}])
        r.verify_level = "tensor"
        return r

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    assert bench.main(["--json", "rmsnorm", "--preset", "tiny", "--tokens", "4"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (row["compile_s"], row["compile_cpu_s"], row["tasks"]) == (2.25, 1.25, 120)


def test_a_launch_record_carries_tasks_and_compile_seconds():
    from harness.entries._kernel import sequential_cost
    from harness.platforms.base import CostReport, LaunchResult

    res = LaunchResult(ok=True, rank=2, cost=CostReport(12.5, 900, "a5", 84, 37),
                       timings={"compile_s": 0.75, "compile_cpu_s": 0.5})
    rec = res.cost_record()
    assert (rec["rank"], rec["tasks"], rec["compile_s"], rec["compile_cpu_s"]) == (2, 37, 0.75, 0.5)
    both = sequential_cost([rec, dict(rec, tasks=3, compile_s=0.25, compile_cpu_s=0.25)])
    assert (both["tasks"], both["compile_s"], both["compile_cpu_s"], both["launches"]) == \
        (40, 1.0, 0.75, 2)
    untimed = {k: v for k, v in rec.items() if k != "compile_s"}
    assert "compile_s" not in sequential_cost([rec, untimed])


def test_a_case_its_fixture_cannot_build_is_reported_and_the_rest_run(monkeypatch, capsys):
    def fake_run(case, *a, **k):
        return CaseResult(case=case, sut="kernel:x", status="pass",
                          costs=[{"rank": 0, "aicore_e2e_us": 1.0, "total_cycles": 1}])

    def broken_work(entry, case):
        if case.entry == "gate":
            raise RuntimeError("random_ expects 'from' to be less than 'to'")
        return bench_case_work(entry, case)

    import harness.runner
    bench_case_work = bench.case_work
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    monkeypatch.setattr(bench, "case_work", broken_work)
    assert bench.main(["--json", "gate", "rmsnorm", "--preset", "tiny"]) == 1
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert rows and {r["entry"] for r in rows} == {"rmsnorm"}
    assert "gate-" in captured.err and "not run: RuntimeError: random_ expects" in captured.err


def test_order_audit_fails_a_case_whose_task_graph_is_unordered(monkeypatch, capsys):
    import os
    from pathlib import Path

    head = "seqNo,taskId,rootIndex,rootHash,opmagic,leafIndex,leafHash,coreType,psgId,successors"
    f = 1 << 20  # functions 1, 2: iterations of loop w; 3: a later reader

    def task(t, h, succ):
        return f"0,{t},0,{h},1,0,0,0,0,,{','.join(map(str, succ))}"
    last_only = [task(f, "w", []), task(2 * f, "w", [3 * f]), task(3 * f, "r", [])]
    every = [task(f, "w", [3 * f]), task(2 * f, "w", [3 * f]), task(3 * f, "r", [])]
    seen = []

    def fake_run(case, *a, **k):
        if "V41_RUN_DIR" in os.environ:  # a launch that keeps its task graph
            root = Path(os.environ["V41_RUN_DIR"])
            seen.append((root, os.environ.get("V41_KEEP_RUN_DIR")))
            out = root / "launch-0001-x-rank0" / "output" / "o1"
            out.mkdir(parents=True)
            lines = last_only if case.entry == "rmsnorm" else every
            (out / "dyn_topo.txt").write_text("\n".join([head] + lines) + "\n")
        return CaseResult(case=case, sut="kernel:x", status="pass",
                          costs=[{"rank": 0, "aicore_e2e_us": 4.0, "total_cycles": 1}])

    import harness.runner
    monkeypatch.setattr(harness.runner, "run_case", fake_run)
    monkeypatch.delenv("V41_RUN_DIR", raising=False)
    assert bench.main(["--json", "--order-audit", "rmsnorm", "gate", "--preset", "flash",
                       "--tokens", "192"]) == 1
    rows = {r["entry"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["gate"]["order"] == "ordered"
    assert rows["rmsnorm"]["order"].startswith("unordered (1 of 1 launches): launch-0001-x-rank0")
    assert len(seen) == 2 and all(keep == "1" and not root.exists() for root, keep in seen)
    assert "V41_RUN_DIR" not in os.environ
    assert bench.main(["--json", "gate", "--preset", "flash", "--tokens", "192"]) == 0
    assert json.loads(capsys.readouterr().out)["order"] is None  # not audited unless asked
