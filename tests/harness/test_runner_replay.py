"""Runner, save and replay over synthetic entries (generic harness; no model imports)."""

import json

import pytest
import torch

from harness import registry
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.data import DataError, load_case
from harness.fixtures import SENTINEL, randn, sentinel
from harness.registry import Entry, SutOutput
from harness.replay import main as replay_main, replay_tree
from harness.runner import run_case

SUPPORT = Support(phase="decode", tp_sizes=(1, 2), wirings=("replicated", "sharded"),
                  inactive_rows=True)


def _inputs(cfg, case):
    return {"x": randn((case.tokens, 64), case.seed, "x", torch.bfloat16),
            "out": sentinel((case.tokens, 64))}


def _golden(cfg, case, inp):
    out = inp["out"]
    out[:case.active] = (inp["x"][:case.active].float() * 2).bfloat16()
    out[case.active:] = 0
    return {"out": out}


def _compare(cfg, case, inp, gold, act):
    rows = torch.arange(case.tokens) < case.active
    return (check_row_bound("out", act["out"], gold["out"], rows)
            + check_sentinel("out", act["out"], SENTINEL, rows)
            + check_zero_rows("out", act["out"], ~rows))


def _good(platform, cfg, case, inp):
    out = inp["out"]
    out[:case.active] = (inp["x"][:case.active].float() + inp["x"][:case.active].float()).bfloat16()
    out[case.active:] = 0
    return SutOutput({"out": out}, [{"rank": 0, "aicore_e2e_us": 12.5, "total_cycles": 22500}])


def _bad_last_row(platform, cfg, case, inp):
    res = _good(platform, cfg, case, inp)
    res.outputs["out"][case.active - 1] *= 1.2
    return res


def _forgets_padding(platform, cfg, case, inp):
    res = _good(platform, cfg, case, inp)
    res.outputs["out"][case.active:] = SENTINEL
    return res


def _crashes(platform, cfg, case, inp):
    raise RuntimeError("kernel exploded")


def _entry(name, sut):
    return Entry(name=name, description="synthetic", support=SUPPORT,
                 matrix=(Case(entry=name, tokens=9, active_tokens=7, requests=2),),
                 build_inputs=_inputs, golden=_golden, compare=_compare,
                 alternate=sut, alternate_label=name)


SELFTEST = [_entry(name, sut) for name, sut in (
    ("selftest_good", _good), ("selftest_bad_row", _bad_last_row),
    ("selftest_padding", _forgets_padding), ("selftest_crash", _crashes),
    ("selftest_missing", lambda platform, cfg, case, inp: SutOutput({}, [])))]


@pytest.fixture(autouse=True)
def _selftest_entries():
    with registry.registered(*SELFTEST):
        yield


def _case(name, **kw):
    return Case(entry=name, tokens=9, active_tokens=7, requests=2, **kw)


def test_good_entry_passes_with_cost():
    r = run_case(_case("selftest_good"))
    assert r.status == "pass", r.failure_text()
    assert r.sut == "golden-alt:selftest_good"
    assert r.estimated_a5_us() == 12.5


def test_one_bad_row_fails_naming_it():
    r = run_case(_case("selftest_bad_row"))
    assert r.status == "fail"
    bad = [v for v in r.verdicts if not v.passed]
    assert {v.check for v in bad} >= {"row_rms", "row_peak"}
    assert all(v.row == 6 for v in bad)


def test_padding_left_as_sentinel_fails_zero_rows():
    r = run_case(_case("selftest_padding"))
    assert r.status == "fail"
    assert [v.check for v in r.verdicts if not v.passed] == ["zero_rows"]


def test_crash_is_an_error_result_not_an_exception():
    r = run_case(_case("selftest_crash"))
    assert r.status == "error" and "kernel exploded" in r.reason


def test_save_and_replay_reproduce_the_verdict(tmp_path):
    for name in ("selftest_good", "selftest_bad_row"):
        run_case(_case(name, wiring="sharded"), save_root=tmp_path)
    results = {r.case_id.split("-")[0]: r for r in replay_tree(tmp_path / "sharded")}
    assert results["selftest_good"].status == "pass"
    assert results["selftest_bad_row"].status == "fail"
    assert all(r.same_as_saved for r in results.values())
    # --rerun runs the alternate path again and reaches the same verdicts
    assert all(r.same_as_saved for r in replay_tree(tmp_path / "sharded", rerun=True))


def test_manifest_records_axes_hashes_and_versions(tmp_path):
    r = run_case(_case("selftest_good"), save_root=tmp_path)
    m = json.loads((tmp_path / "replicated" / r.case.case_id / "manifest.json").read_text())
    assert m["case"]["tokens"] == 9 and m["case"]["active_tokens"] == 7 and m["case"]["seed"] == 17
    assert set(m["sha256"]) == {"inputs.safetensors", "golden.safetensors", "actual.safetensors"}
    assert {"torch", "pypto", "python"} <= set(m["versions"])
    assert any(v["check"] == "row_rms" and v["bound"] > 0 for v in m["verdicts"])


def test_replay_refuses_other_wiring(tmp_path):
    run_case(_case("selftest_good", wiring="replicated"), save_root=tmp_path)
    with pytest.raises(DataError, match="wiring 'replicated', refused for 'sharded'"):
        replay_tree(tmp_path / "replicated", wiring="sharded")
    # a replicated case folder moved under sharded/ is refused too
    (tmp_path / "sharded").mkdir()
    src = next((tmp_path / "replicated").iterdir())
    src.rename(tmp_path / "sharded" / src.name)
    [res] = replay_tree(tmp_path / "sharded")
    assert res.status == "error" and "refused" in res.reason


def test_tampered_missing_and_corrupted_files_are_named(tmp_path):
    r = run_case(_case("selftest_good"), save_root=tmp_path)
    folder = tmp_path / "replicated" / r.case.case_id
    data = bytearray((folder / "actual.safetensors").read_bytes())
    data[-1] ^= 0x01
    (folder / "actual.safetensors").write_bytes(bytes(data))
    with pytest.raises(DataError, match="actual.safetensors: sha256 mismatch"):
        load_case(folder)
    (folder / "golden.safetensors").unlink()
    with pytest.raises(DataError, match="golden.safetensors: missing"):
        load_case(folder)
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupted manifest"):
        load_case(folder)
    assert replay_main([str(tmp_path / "replicated")]) == 1


def test_replay_of_empty_tree_fails(tmp_path):
    (tmp_path / "sharded").mkdir()
    assert replay_main([str(tmp_path / "sharded")]) == 1


def test_missing_sut_output_is_an_error_result():
    r = run_case(_case("selftest_missing"))
    assert r.status == "error" and "comparison impossible" in r.reason and "out" in r.reason


def test_alternate_path_never_serves_on_cards():
    r = run_case(_case("selftest_good", platform="a5"))
    assert r.status == "skip" and "no v41 kernel for selftest_good" in r.reason


def test_cli_run_where_nothing_passed_fails(tmp_path):
    from harness.cli import main
    assert main(["run", "selftest_good", "-p", "a5", "--summary", str(tmp_path / "s.json")]) == 1
    assert main(["run", "selftest_good", "--summary", str(tmp_path / "s.json")]) == 0


def _rewrite_manifest(folder, **changes):
    """Edit case axes consistently (case_id follows them) and claim a pass."""
    m = json.loads((folder / "manifest.json").read_text())
    for k, v in changes.items():
        m["case"][k] = v
    m["case_id"] = Case(**m["case"]).case_id
    m["status"] = "pass"
    (folder / "manifest.json").write_text(json.dumps(m))
    return m


def test_an_edited_manifest_cannot_turn_a_failure_into_a_pass(tmp_path):
    r = run_case(_case("selftest_bad_row"), save_root=tmp_path)
    folder = tmp_path / "replicated" / r.case.case_id
    _rewrite_manifest(folder, seed=18, active_tokens=5)
    [res] = replay_tree(tmp_path / "replicated")
    assert res.status == "error" and "inputs.safetensors" in res.reason


def test_a_golden_swapped_for_the_actual_is_caught_even_with_rewritten_hashes(tmp_path):
    from harness.data import sha256
    r = run_case(_case("selftest_bad_row"), save_root=tmp_path)
    folder = tmp_path / "replicated" / r.case.case_id
    (folder / "golden.safetensors").write_bytes((folder / "actual.safetensors").read_bytes())
    m = json.loads((folder / "manifest.json").read_text())
    m["sha256"]["golden.safetensors"] = sha256(folder / "golden.safetensors")
    m["status"] = "pass"
    (folder / "manifest.json").write_text(json.dumps(m))
    [res] = replay_tree(tmp_path / "replicated")
    assert res.status == "error" and "golden.safetensors" in res.reason
