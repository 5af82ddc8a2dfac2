"""harness.bench_merge: per-entry bench JSON rows joined into one baseline that --check accepts.

Launch-free: the runner is replaced by a fake with set estimates (as in test_bench_baseline.py).
"""

import json
from pathlib import Path

import pytest

from harness import bench, bench_baseline, bench_merge


def flash_ids(entry):
    return [c.case_id for c in bench.bench_cases([entry], "flash", None)]


def rows_file(tmp_path, capsys, entry):
    """One entry's `bench --json` stdout, as a per-entry FLASH scan saves it."""
    capsys.readouterr()
    rc = bench.main(["--preset", "flash", "--estimate-only", "--json", entry])
    path = tmp_path / f"{entry}.jsonl"
    path.write_text(capsys.readouterr().out)
    return rc, path


def merge(out, *files, partial=True):
    return bench_merge.main([*map(str, files), "--preset", "flash", "-o", str(out),
                             *(["--partial"] if partial else [])])


def test_merged_rows_make_the_baseline_check_accepts(tmp_path, est, capsys):
    assert rows_file(tmp_path, capsys, "rmsnorm")[0] == 0
    assert rows_file(tmp_path, capsys, "gate")[0] == 0
    out = tmp_path / "flash.json"
    assert merge(out, tmp_path / "rmsnorm.jsonl", tmp_path / "gate.jsonl") == 0
    doc = bench_baseline.load_baseline(str(out))
    assert doc["selection"] == {"gate": False, "preset": "flash", "tokens": None}
    assert [r["case"] for r in doc["cases"]] == sorted(flash_ids("gate") + flash_ids("rmsnorm"))
    assert {r["entry"]: r["estimated_us"] for r in doc["cases"]} == {"rmsnorm": 10.0, "gate": 20.0}
    # a later per-entry run is judged against it: equal passes, 6 % slower fails by name
    capsys.readouterr()
    assert bench.main(["--preset", "flash", "--estimate-only", "rmsnorm", "--check", str(out)]) == 0
    est["rmsnorm"] = 10.6
    assert bench.main(["--preset", "flash", "--estimate-only", "rmsnorm", "--check", str(out)]) == 1
    assert f"REGRESSION {flash_ids('rmsnorm')[0]}: 10.000 -> 10.600 us" in capsys.readouterr().out


def test_incomplete_selection_is_refused_naming_the_missing_cases(tmp_path, est, capsys):
    rows_file(tmp_path, capsys, "rmsnorm")
    out = tmp_path / "flash.json"
    assert merge(out, tmp_path / "rmsnorm.jsonl", partial=False) == 2
    err = capsys.readouterr().err
    assert "have no row" in err and flash_ids("gate")[0] in err
    assert not out.exists()


@pytest.mark.parametrize("bad, message", [
    ("dup", "given twice"),
    ("preset", "preset 'tiny', the baseline is 'flash'"),
    ("stray", "not a JSON bench row"),
    ("topology", "simulated topology"),
])
def test_bad_rows_are_refused_before_any_write(tmp_path, est, capsys, bad, message):
    rows_file(tmp_path, capsys, "rmsnorm")
    src = tmp_path / "rmsnorm.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    if bad == "dup":
        rows.append(rows[0])
    elif bad == "preset":
        rows[0]["preset"] = "tiny"
    elif bad == "topology":
        rows[1]["topology"] = {**rows[1]["topology"], "cube_cores": 1}
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    src.write_text(text + ("rmsnorm: not run\n" if bad == "stray" else ""))
    out = tmp_path / "flash.json"
    assert merge(out, src) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_row_without_an_estimate_is_refused(tmp_path, est, capsys):
    est["rmsnorm"] = None
    assert rows_file(tmp_path, capsys, "rmsnorm")[0] == 1
    out = tmp_path / "flash.json"
    assert merge(out, tmp_path / "rmsnorm.jsonl") == 2
    assert "no passing estimate" in capsys.readouterr().err
    assert not out.exists()


def test_committed_flash_baseline_covers_every_flash_case():
    """harness/baselines/bench_flash.json: one record per FLASH bench case of every kernel
    entry (a new FLASH case needs its estimate merged in), made on the simulated A5."""
    path = Path(bench_baseline.__file__).parent / "baselines" / "bench_flash.json"
    doc = bench_baseline.load_baseline(str(path))
    assert doc["selection"] == bench_baseline.selection("flash", None, False)
    assert {r["case"] for r in doc["cases"]} == set(flash_ids_all())
    topo = bench._topology_record()
    for rec in doc["cases"]:
        assert {k: rec["topology"][k] for k in bench_baseline.TOPOLOGY_KEYS} == {
            k: topo[k] for k in bench_baseline.TOPOLOGY_KEYS}
        assert rec["pypto"] == bench_baseline.pypto_version()


def flash_ids_all():
    return [c.case_id for c in bench.bench_cases([], "flash", None)]
