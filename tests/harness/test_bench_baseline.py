"""bench --save-baseline / --check / --gate and the committed TINY baseline.

Launch-free: the runner is replaced by a fake whose estimates each test sets, as in
tests/harness/test_bench.py.
"""

import json
from pathlib import Path

import pytest

from harness import bench, bench_baseline, registry

COMMITTED = Path(bench_baseline.__file__).parent / "baselines" / "bench_tiny.json"


def first_tiny(name):
    return next(c for c in registry.get(name).matrix if c.preset == "tiny").case_id


def save(path, *entries):
    return bench.main(["--gate", "--estimate-only", *entries, "--save-baseline", str(path)])


def check(path, *entries):
    return bench.main(["--gate", "--estimate-only", *entries, "--check", str(path)])


def edit(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def test_gate_is_each_entrys_first_tiny_case():
    cases = bench_baseline.gate_cases(["rmsnorm", "gate"])
    assert [c.case_id for c in cases] == [first_tiny("gate"), first_tiny("rmsnorm")]
    every = bench_baseline.gate_cases([])
    kernels = [n for n, e in registry.entries().items() if "a5sim" in e.kernels]
    blocks = [n for n in kernels if not n.startswith(("decode_", "prefill_"))]
    assert "rmsnorm" in blocks and "sparse_attention" in blocks
    assert set(bench_baseline.GATE_COMPOSITIONS) < set(kernels) - set(blocks)
    assert [c.entry for c in every] == [n for n in kernels
                                        if n in blocks or n in bench_baseline.GATE_COMPOSITIONS]
    assert "decode_attn_swa" not in {c.entry for c in every}
    assert [c.case_id for c in every] == [first_tiny(c.entry) for c in every]
    # a named decode entry is run even when the CI set leaves it out
    named = bench_baseline.gate_cases(["decode_attn_swa"])
    assert [c.case_id for c in named] == [first_tiny("decode_attn_swa")]


def test_saved_baseline_has_one_record_per_case_in_case_order(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm", "gate") == 0
    doc = json.loads(path.read_text())
    assert doc["format"] == bench_baseline.FORMAT
    assert doc["selection"] == {"gate": True, "preset": "tiny", "tokens": None}
    assert [r["case"] for r in doc["cases"]] == sorted([first_tiny("gate"), first_tiny("rmsnorm")])
    rec = {r["entry"]: r for r in doc["cases"]}["rmsnorm"]
    assert list(rec) == list(bench_baseline.RECORD_KEYS)
    assert rec["estimated_us"] == 10.0 and rec["total_cycles"] == 18000
    assert rec["preset"] == "tiny" and rec["tp"] == 1
    assert rec["pypto"] == bench_baseline.pypto_version() == "0.2.0"
    assert rec["topology"]["cube_cores"] == bench._topology_record()["cube_cores"]
    first = path.read_text()
    assert save(path, "gate", "rmsnorm") == 0
    assert path.read_text() == first  # stable: same cases, same bytes


def test_check_against_its_own_save_passes(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm", "gate") == 0
    capsys.readouterr()
    assert check(path, "rmsnorm", "gate") == 0
    out = capsys.readouterr().out
    assert "baseline check passed: 2 ok, 0 REGRESSION" in out
    assert "1.000x" in out


def test_six_percent_slower_fails_naming_case_and_ratio(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm", "gate") == 0
    est["rmsnorm"] = 10.6
    capsys.readouterr()
    assert check(path, "rmsnorm", "gate") == 1
    out = capsys.readouterr().out
    assert f"REGRESSION {first_tiny('rmsnorm')}: 10.000 -> 10.600 us (1.060x" in out
    assert "REGRESSION " + first_tiny("gate") not in out
    assert "baseline check FAILED: 1 ok, 1 REGRESSION" in out


def test_json_check_keeps_stdout_for_the_rows(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    est["rmsnorm"] = 11.0
    capsys.readouterr()
    assert bench.main(["--gate", "--json", "rmsnorm", "--check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert [json.loads(line)["estimated_us"] for line in out.splitlines()] == [11.0]
    assert f"REGRESSION {first_tiny('rmsnorm')}: 10.000 -> 11.000 us (1.100x" in err


def test_four_percent_slower_passes(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm", "gate") == 0
    est["rmsnorm"] = 10.4
    capsys.readouterr()
    assert check(path, "rmsnorm", "gate") == 0
    out = capsys.readouterr().out
    assert "1.040x" in out and "REGRESSION " + first_tiny("rmsnorm") not in out


def test_faster_by_more_than_tolerance_is_listed_not_failed(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    est["rmsnorm"] = 9.0
    capsys.readouterr()
    assert check(path, "rmsnorm") == 0
    out = capsys.readouterr().out
    assert f"improved {first_tiny('rmsnorm')}: 10.000 -> 9.000 us (0.900x): refresh" in out


def test_missing_case_fails_by_name(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    gone = first_tiny("rmsnorm").replace("-t1-", "-t999-")

    def add_gone(doc):
        doc["cases"].append(dict(doc["cases"][0], case=gone, tokens=999))
    edit(path, add_gone)
    capsys.readouterr()
    assert check(path, "rmsnorm") == 1
    out = capsys.readouterr().out
    assert f"MISSING {gone}: in the baseline, not produced by this run" in out


def test_new_case_is_listed_and_does_not_fail(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    capsys.readouterr()
    assert check(path, "rmsnorm", "gate") == 0
    out = capsys.readouterr().out
    assert f"new, no baseline: {first_tiny('gate')} (20.000 us)" in out


def test_named_entries_narrow_the_check(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm", "gate") == 0
    capsys.readouterr()
    assert check(path, "rmsnorm") == 0  # gate's record is out of scope, not missing
    assert "MISSING" not in capsys.readouterr().out


def test_a_case_without_estimate_fails_the_check(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    est["rmsnorm"] = None
    capsys.readouterr()
    assert check(path, "rmsnorm") == 1
    assert f"NO ESTIMATE {first_tiny('rmsnorm')}" in capsys.readouterr().out


def test_save_refuses_a_run_with_a_failing_case(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    est["gate"] = None
    assert save(path, "rmsnorm", "gate") == 1
    assert not path.exists()
    err = capsys.readouterr().err
    assert f"not written, no passing estimate for {first_tiny('gate')} (error)" in err


@pytest.mark.parametrize("field, value, message", [
    ("cube_cores", 1, "topology mismatch"),
    ("pypto", "0.1.9", "pypto version mismatch"),
])
def test_topology_or_pypto_mismatch_fails_before_any_run(tmp_path, est, capsys, field, value,
                                                         message):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0

    def change(doc):
        rec = doc["cases"][0]
        (rec["topology"] if field in rec["topology"] else rec)[field] = value
    edit(path, change)
    est["calls"].clear()
    capsys.readouterr()
    assert check(path, "rmsnorm") == 1
    err = capsys.readouterr().err
    assert message in err and "not comparable" in err and first_tiny("rmsnorm") in err
    assert est["calls"] == []


def test_another_selection_is_refused(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    est["calls"].clear()
    assert bench.main(["rmsnorm", "--preset", "flash", "--check", str(path)]) == 1
    assert "the baseline was made with" in capsys.readouterr().err and est["calls"] == []


@pytest.mark.parametrize("change, field", [
    (lambda d: d["cases"][0].update(estimated_us="fast"), "cases[0].estimated_us"),
    (lambda d: d["cases"][0].update(estimated_us=-1.0), "cases[0].estimated_us"),
    (lambda d: d["cases"][0].pop("tp"), "cases[0].tp: missing"),
    (lambda d: d["cases"][0]["topology"].pop("clock_mhz"), "cases[0].topology.clock_mhz"),
    (lambda d: d["cases"][0].update(case="gate-x"), "cases[0].case"),
    (lambda d: d["cases"].append(dict(d["cases"][0])), "cases[1].case: duplicate"),
    (lambda d: d.update(format="v0"), "format: expected"),
    (lambda d: d["selection"].update(gate="yes"), "selection.gate"),
    (lambda d: d.update(cases=[]), "cases: expected a non-empty list"),
])
def test_corrupt_baseline_is_refused_naming_the_field(tmp_path, est, capsys, change, field):
    path = tmp_path / "b.json"
    assert save(path, "rmsnorm") == 0
    edit(path, change)
    est["calls"].clear()
    capsys.readouterr()
    assert check(path, "rmsnorm") == 2
    err = capsys.readouterr().err
    assert f"--check {path}: {field}" in err and est["calls"] == []


def test_unreadable_baseline_is_refused(tmp_path, est, capsys):
    path = tmp_path / "b.json"
    path.write_text("{not json")
    assert check(path, "rmsnorm") == 2
    assert "not JSON" in capsys.readouterr().err
    assert check(tmp_path / "absent.json", "rmsnorm") == 2
    assert "cannot read" in capsys.readouterr().err and est["calls"] == []


def test_bad_flags_are_refused_before_any_run(tmp_path, est, capsys):
    assert bench.main(["--gate", "--preset", "flash", "rmsnorm"]) == 2
    assert "--gate runs the TINY cases; --preset flash conflicts" in capsys.readouterr().err
    assert bench.main(["--gate", "--tokens", "4", "rmsnorm"]) == 2
    assert "--tokens conflicts" in capsys.readouterr().err
    assert bench.main(["rmsnorm", "--save-baseline", str(tmp_path / "no" / "b.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not allowed together
        bench.main(["rmsnorm", "--save-baseline", "a.json", "--check", "b.json"])
    assert est["calls"] == []


def test_committed_tiny_baseline_matches_the_gate_and_this_install():
    doc = bench_baseline.load_baseline(str(COMMITTED))
    assert doc["selection"] == bench_baseline.selection(None, None, True)
    gate = {c.case_id for c in bench_baseline.gate_cases([])}
    assert {r["case"] for r in doc["cases"]} <= gate  # none would be reported missing
    assert bench_baseline.comparable(doc, doc["selection"], bench._topology_record(),
                                     bench_baseline.pypto_version()) is None
