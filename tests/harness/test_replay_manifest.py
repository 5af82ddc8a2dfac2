"""Replay checks the whole manifest, reruns against golden and saved actual, names cases,
replays one case folder and filters a data root by wiring (synthetic entry, no pypto)."""

import dataclasses
import json

import pytest
import torch

from harness import registry
from harness.case import Case, Support
from harness.compare import check_row_bound, check_sentinel, check_zero_rows
from harness.data import DataError, FORMAT_VERSION, save_case
from harness.fixtures import SENTINEL, randn, sentinel
from harness.registry import Entry, SutOutput
from harness.replay import main as replay_main, replay_folder, replay_tree
from harness.runner import run_case

NAME = "replaytest_double"


def _inputs(cfg, case):
    return {"x": randn((case.tokens, 64), case.seed, "x", torch.bfloat16),
            "out": sentinel((case.tokens, 64))}


def _double(platform, cfg, case, inp):
    out = inp["out"]
    out[:case.active] = (inp["x"][:case.active].float() * 2).bfloat16()
    out[case.active:] = 0
    return SutOutput({"out": out}, [])


def _golden(cfg, case, inp):
    return _double(None, cfg, case, inp).outputs


def _compare(cfg, case, inp, gold, act):
    rows = torch.arange(case.tokens) < case.active
    return (check_row_bound("out", act["out"], gold["out"], rows)
            + check_sentinel("out", act["out"], SENTINEL, rows)
            + check_zero_rows("out", act["out"], ~rows))


ENTRY = Entry(name=NAME, description="synthetic doubling", alternate=_double,
              support=Support(phase="decode", wirings=("replicated", "sharded"),
                              inactive_rows=True),
              matrix=(Case(entry=NAME, tokens=9, active_tokens=7, requests=2),),
              build_inputs=_inputs, golden=_golden, compare=_compare, alternate_label=NAME)


@pytest.fixture(autouse=True)
def _entry():
    with registry.registered(ENTRY):
        yield


def _save(root, wiring="replicated"):
    r = run_case(Case(entry=NAME, tokens=9, active_tokens=7, requests=2, wiring=wiring),
                 save_root=root)
    assert r.status == "pass", r.failure_text()
    return root / wiring / r.case.case_id


def _edit(folder, change):
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _replay_error(folder) -> str:
    [res] = replay_tree(folder.parent)
    assert res.status == "error" and not res.ok
    assert replay_main([str(folder.parent)]) == 1
    return res.reason


def _bounded(m) -> int:
    """Index of the first saved verdict with a non-zero bound (a tolerance, not exactness)."""
    return next(i for i, v in enumerate(m["verdicts"]) if v["bound"] > 0)


def test_an_untouched_case_replays_as_a_pass(tmp_path):
    folder = _save(tmp_path)
    [res] = replay_tree(tmp_path)
    assert res.ok and res.status == "pass" and res.reason == "" and res.mode == "replay"
    assert replay_main([str(tmp_path)]) == 0
    assert json.loads((folder / "manifest.json").read_text())["format"] == FORMAT_VERSION


def test_a_loosened_bound_is_named(tmp_path):
    folder = _save(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    i = _bounded(m)
    _edit(folder, lambda m: m["verdicts"][i].update(bound=0.5))
    reason = _replay_error(folder)
    assert f"verdicts[{i}].bound: saved 0.5" in reason and "current bound is" in reason


@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(format=99), "format: 99"),
    (lambda m: m["case"].pop("preset"), "case.preset: missing"),
    (lambda m: m["case"].update(tokens="9"), "case.tokens: '9' is not of type"),
    (lambda m: m["case"].update(flavour="x"), "case.flavour: unknown axis"),
    (lambda m: m.pop("verify_level"), "verify_level: missing"),
    (lambda m: m.update(comment="hi"), "comment: unknown field"),
    (lambda m: m.update(case_id="other"), "case_id: 'other' is not the id"),
    (lambda m: m.update(status="skip"), "status: 'skip' is not one of"),
    (lambda m: m.update(sut="kernel:x"), "sut: 'kernel:x' is not one of"),
    (lambda m: m.update(sut_label="kernel:x"), "sut_label: 'kernel:x' is not 'golden-alt:<name>'"),
    (lambda m: m.pop("sut_label"), "sut_label: missing"),
    (lambda m: m.update(verdicts=[]), "verdicts: not a non-empty list"),
    (lambda m: m["verdicts"][0].pop("relation"), "verdicts[0].relation: missing"),
    (lambda m: m["verdicts"][0].update(bound="0.01"), "verdicts[0].bound: '0.01' is not of type"),
    (lambda m: m["sha256"].pop("golden.safetensors"), "sha256.golden.safetensors: missing"),
    (lambda m: m.update(versions=[]), "versions: not an object"),
])
def test_a_manifest_outside_the_schema_is_refused_naming_the_field(tmp_path, change, field):
    folder = _save(tmp_path)
    _edit(folder, change)
    assert field in _replay_error(folder)


@pytest.mark.parametrize("change, field", [
    (lambda m: m["verdicts"].pop(), "verdicts: 4 saved, the entry computes 5"),
    (lambda m: m["verdicts"][1].update(check="row_max"), "verdicts[1].check: saved 'row_max'"),
    (lambda m: m["verdicts"][2].update(output="y"), "verdicts[2].output: saved 'y'"),
    (lambda m: m["verdicts"][1].update(relation="<"), "verdicts[1].relation: saved '<'"),
])
def test_a_verdict_list_unlike_the_entrys_current_one_is_named(tmp_path, change, field):
    folder = _save(tmp_path)
    assert len(json.loads((folder / "manifest.json").read_text())["verdicts"]) == 5
    _edit(folder, change)
    assert field in _replay_error(folder)


def test_a_flipped_saved_verdict_is_named(tmp_path):
    folder = _save(tmp_path)
    _edit(folder, lambda m: m["verdicts"][3].update(passed=False))
    [res] = replay_tree(tmp_path)
    assert res.status == "pass" and not res.same_as_saved and not res.ok
    assert res.saved_diff == ["verdicts[3] out.sentinel: saved fail, now pass"]
    assert replay_main([str(tmp_path)]) == 1


def test_verify_level_is_recorded_and_shown(tmp_path, capsys):
    folder = _save(tmp_path)
    assert json.loads((folder / "manifest.json").read_text())["verify_level"] is None
    case = Case(entry=NAME, tokens=9, active_tokens=7, requests=2)
    r = run_case(case)
    r.verify_level = "pass-verify-full"  # as a kernel run on a5sim sets it
    inputs = _inputs(case.config, case)
    gold = _golden(case.config, case, _inputs(case.config, case))
    folder = save_case(tmp_path / "v", r, inputs, gold, gold)
    assert json.loads((folder / "manifest.json").read_text())["verify_level"] == "pass-verify-full"
    res = replay_folder(folder)
    assert res.ok and res.verify_level == "pass-verify-full"
    assert replay_main([str(folder)]) == 0
    assert "pass-verify-full" in capsys.readouterr().out


def _resave_with_a_nudged_actual(root):
    """Save the case again with one active element of its actual one bf16 ulp off (within
    every bound) and a manifest consistent with it: hashes and verdicts, as a careful
    tamperer (or a non-reproducible SUT) would leave it."""
    case = Case(entry=NAME, tokens=9, active_tokens=7, requests=2)
    r = run_case(case)
    inputs = _inputs(case.config, case)
    gold = _golden(case.config, case, _inputs(case.config, case))
    actual = {"out": gold["out"].clone()}
    actual["out"].view(torch.int16)[3, 5] += 1
    r.verdicts = _compare(case.config, case, inputs, gold, actual)
    assert all(v.passed for v in r.verdicts)
    return save_case(root, r, inputs, gold, actual)


def test_rerun_compares_with_the_saved_actual_and_names_its_mode(tmp_path, capsys):
    _resave_with_a_nudged_actual(tmp_path)
    assert replay_main([str(tmp_path)]) == 0  # within the bounds: replay alone passes
    plain_out = capsys.readouterr().out
    assert replay_main([str(tmp_path), "--rerun"]) == 1
    rerun_out = capsys.readouterr().out
    assert rerun_out != plain_out
    assert "mode: replay" in plain_out and "mode: rerun" not in plain_out
    assert "mode: rerun" in rerun_out and "rerun vs saved actual: out: 1 of 576" in rerun_out
    [plain] = replay_tree(tmp_path)
    assert plain.ok and plain.actual_diff is None
    [rerun] = replay_tree(tmp_path, rerun=True)
    assert rerun.status == "pass" and rerun.mode == "rerun" and not rerun.ok
    [diff] = rerun.actual_diff
    assert diff.startswith("out: 1 of 576 elements differ, first at (3, 5)")


def test_rerun_of_an_intact_case_reproduces_the_saved_actual(tmp_path, capsys):
    _save(tmp_path)
    [res] = replay_tree(tmp_path, rerun=True)
    assert res.ok and res.actual_diff == []
    assert replay_main([str(tmp_path), "--rerun"]) == 0
    assert "identical" in capsys.readouterr().out


def test_a_rerun_whose_sut_crashes_is_an_error(tmp_path, monkeypatch):
    _save(tmp_path)

    def boom(platform, cfg, case, inp):
        raise RuntimeError("kernel exploded")
    crashing = dataclasses.replace(ENTRY, alternate=boom)
    monkeypatch.setattr(registry, "get", lambda name: crashing)
    [res] = replay_tree(tmp_path, rerun=True)
    assert res.status == "error" and "kernel exploded" in res.reason


def test_error_rows_name_the_case_when_the_manifest_is_readable(tmp_path):
    folder = _save(tmp_path)
    path = folder / "actual.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    [res] = replay_tree(tmp_path)
    assert res.status == "error" and "sha256 mismatch" in res.reason
    assert res.case_id == folder.name
    (folder / "manifest.json").write_text("{not json")
    [res] = replay_tree(tmp_path)
    assert res.case_id == "?" and "corrupted manifest" in res.reason


def test_a_single_case_folder_replays(tmp_path):
    folder = _save(tmp_path, "sharded")
    [res] = replay_tree(folder)
    assert res.ok and res.folder == str(folder)
    assert replay_main([str(folder)]) == 0
    assert replay_main([str(folder), "--wiring", "sharded"]) == 0
    with pytest.raises(DataError, match="saved for wiring 'sharded', refused for 'replicated'"):
        replay_tree(folder, wiring="replicated")


def test_wiring_on_a_data_root_replays_that_wiring_only(tmp_path):
    _save(tmp_path, "replicated")
    _save(tmp_path, "sharded")
    for wiring in ("replicated", "sharded"):
        [res] = replay_tree(tmp_path, wiring=wiring)
        assert res.ok and f"-{wiring}-" in res.case_id
        assert replay_main([str(tmp_path), "--wiring", wiring]) == 0
    assert len(replay_tree(tmp_path)) == 2


def test_wiring_on_a_root_without_that_wiring_finds_no_cases(tmp_path):
    _save(tmp_path, "sharded")
    with pytest.raises(DataError, match="no saved cases under .*replicated"):
        replay_tree(tmp_path, wiring="replicated")
    assert replay_main([str(tmp_path), "--wiring", "replicated"]) == 1


@pytest.mark.parametrize("key, value, field", [
    ("row", "0", "verdicts[1].row: saved '0'"),
    ("measured", 0.25, "verdicts[1].measured: saved 0.25"),
])
def test_a_saved_verdict_unlike_the_saved_tensors_is_named(tmp_path, key, value, field):
    folder = _save(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    assert m["verdicts"][1]["check"] == "row_rms" and m["verdicts"][1][key] != value
    _edit(folder, lambda m: m["verdicts"][1].update({key: value}))
    assert field in _replay_error(folder)


def test_a_rerun_with_another_sut_than_the_saved_one_is_named(tmp_path, monkeypatch):
    _save(tmp_path)
    renamed = dataclasses.replace(ENTRY, alternate_label="other_path")
    monkeypatch.setattr(registry, "get", lambda name: renamed)
    [res] = replay_tree(tmp_path, rerun=True)
    assert res.status == "pass" and res.actual_diff == [] and not res.ok
    assert res.saved_diff == [f"sut: saved by golden-alt:{NAME}, rerun with golden-alt:other_path"]


def test_output_differences_name_each_kind_of_difference():
    from harness.replay import output_differences
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert output_differences({"a": x}, {"a": x + 1e-9}) == []  # reassociation noise
    nudged = x.clone()
    nudged[2, 1] += 0.5
    assert output_differences({"a": x, "b": x}, {"a": nudged, "c": x}) == [
        "a: 1 of 12 elements differ, first at (2, 1): rerun 9.5, saved 9.0",
        "b: saved, not produced by the rerun",
        "c: produced by the rerun, absent from actual.safetensors"]
    assert output_differences({"a": x}, {"a": x.half()}) == [
        "a: rerun torch.float16(3, 4), saved torch.float32(3, 4)"]
    codes = torch.zeros(4, dtype=torch.uint8)
    assert output_differences({"q": codes}, {"q": codes + 1})[0].startswith(
        "q: 4 of 4 elements differ")
