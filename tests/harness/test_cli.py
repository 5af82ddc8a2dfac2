"""``python -m harness``: case selection, refusals, skip policy and ``list --json``
(over synthetic entries on a fake platform, except where the real registry is named)."""

import json
import subprocess
import sys

import pytest
from harness_fakes import MATRIX_TOKENS, use_fakes

from harness import registry
from harness.cli import main


def _run(capsys, tmp_path, *argv):
    summary = tmp_path / "summary.json"
    rc = main(["run", *argv, "--summary", str(summary)])
    out, err = capsys.readouterr()
    data = json.loads(summary.read_text()) if summary.exists() else None
    return rc, out, err, data


def test_entry_runs_its_whole_matrix(monkeypatch, capsys, tmp_path):
    """Only the first matrix case is right: running the entry must see the others fail."""
    use_fakes(monkeypatch)
    rc, _, _, data = _run(capsys, tmp_path, "fake_scaled")
    assert rc == 1
    assert [c["status"] for c in data["cases"]] == ["pass", "fail", "fail"]
    assert [c["case_id"].split("-")[3] for c in data["cases"]] == [f"t{t}" for t in MATRIX_TOKENS]


def test_axis_flags_filter_the_entry_matrix(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    rc, _, _, data = _run(capsys, tmp_path, "fake_kernel", "--tp", "2")
    assert rc == 0 and len(data["cases"]) == len(MATRIX_TOKENS)
    assert all("-tp2-" in c["case_id"] for c in data["cases"])
    rc, _, _, data = _run(capsys, tmp_path, "fake_kernel", "--tokens", "8")
    assert rc == 0 and [c["case_id"].split("-")[1] for c in data["cases"]] == ["tp1", "tp2"]


def test_explicit_values_off_the_matrix_build_from_its_first_case(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    rc, _, _, data = _run(capsys, tmp_path, "fake_kernel", "--tokens", "5", "--seed", "3")
    assert rc == 0
    assert [c["case_id"] for c in data["cases"]] == [
        "fake_kernel-tp1-dp1-t5-r1-e1-replicated-mixed-s3-tiny"]


def test_all_with_an_entry_name_is_refused(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    rc, out, err, data = _run(capsys, tmp_path, "fake_kernel", "--all")
    assert rc == 2 and data is None
    assert "--all" in err and "fake_kernel" in err and "not both" in err


def test_unknown_entry_is_a_plain_message_with_close_matches(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    rc, _, err, _ = _run(capsys, tmp_path, "fake_kernal")
    assert rc == 2
    line = err.strip()
    assert line.startswith("error: entry: fake_kernal is not registered")
    assert "did you mean fake_kernel" in line
    assert '"' not in line and "'" not in line
    with pytest.raises(registry.UnknownEntryError) as info:
        registry.get("fake_kernal")
    assert isinstance(info.value, KeyError)  # callers that catch KeyError keep working
    assert str(info.value) == info.value.args[0]


def test_all_refuses_an_axis_value_the_harness_refuses(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch)
    rc, _, err, data = _run(capsys, tmp_path, "--all", "--tp", "3")
    assert rc == 2 and data is None
    assert err.strip() == "error: tp: 3 is not one of (1, 2, 4, 8)"


def test_skipped_kernel_case_fails_the_run_unless_allowed(monkeypatch, capsys, tmp_path):
    """a5sim unavailable: golden-alt cases pass, the kernel case skips; that is no success."""
    use_fakes(monkeypatch, platform_ok=False)
    rc, out, err, data = _run(capsys, tmp_path, "--all", "--tp", "2", "--tokens", "8")
    kinds = sorted((c["sut_kind"], c["status"]) for c in data["cases"])
    assert kinds == [("golden-alt", "pass"), ("kernel", "skip")]
    assert rc == 1
    assert "fake_kernel-tp2-dp1-t8-r1-e1-replicated-mixed-s17-tiny" in err
    assert "pypto calculator missing (test)" in err and "--allow-skip" in err
    assert data["counts_by_sut"]["kernel"]["skip"] == 1
    assert data["counts_by_sut"]["golden-alt"]["pass"] == 1
    rc, out, err, _ = _run(capsys, tmp_path, "--all", "--tp", "2", "--tokens", "8",
                           "--allow-skip")
    assert rc == 0
    assert "fake_kernel-tp2-dp1-t8-r1-e1-replicated-mixed-s17-tiny" in out + err
    assert "pypto calculator missing (test)" in out + err


def test_list_json_names_sut_phase_and_case_ids(monkeypatch, capsys):
    entries = use_fakes(monkeypatch)
    assert main(["list", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert set(listed) == set(entries)
    assert listed["fake_kernel"]["sut"] == "kernel" and listed["fake_alt"]["sut"] == "golden-alt"
    assert listed["fake_alt"]["phase"] == "prefill"
    assert listed["fake_scaled"]["cases"] == [c.case_id for c in entries["fake_scaled"].matrix]


def test_list_json_of_the_real_registry():
    p = subprocess.run([sys.executable, "-m", "harness", "list", "--json"], capture_output=True,
                       text=True, check=True)
    listed = {e["name"]: e for e in json.loads(p.stdout)}
    assert listed["rmsnorm"]["sut"] == "kernel" and listed["rmsnorm"]["phase"] == "prefill"
    assert listed["golden_alt_decode_attn_c1a_full"]["sut"] == "golden-alt"
    assert listed["golden_alt_decode_attn_c1a_full"]["phase"] == "decode"
    assert len(listed["rmsnorm"]["cases"]) == len(registry.get("rmsnorm").matrix)


def test_only_skipped_kernel_cases_is_a_failure_even_with_allow_skip(monkeypatch, capsys, tmp_path):
    use_fakes(monkeypatch, platform_ok=False)
    rc, _, err, data = _run(capsys, tmp_path, "fake_kernel", "--tokens", "8", "--tp", "1")
    assert rc == 1 and [c["status"] for c in data["cases"]] == ["skip"]
    assert "1 kernel case(s) skipped" in err and "no case passed" in err
    rc, _, err, _ = _run(capsys, tmp_path, "fake_kernel", "--tokens", "8", "--tp", "1",
                         "--allow-skip")
    assert rc == 1 and "no case passed" in err and "kernel case(s) skipped" not in err


def test_dp_tokens_flag_builds_the_case_and_refuses_a_disagreeing_list(monkeypatch, capsys, tmp_path):
    """--dp-tokens is an axis: it reaches the case (its id names it), and a list that does
    not give one count per DP group, or exceeds tokens, is refused before any work."""
    from harness.cli import build_parser, select_cases
    args = build_parser().parse_args(["run", "prefill_c2a_full", "--tp", "4", "--dp", "2",
                                      "--tokens", "7", "--dp-tokens", "7,1", "--epochs", "3"])
    [case] = select_cases(args)
    assert case.dp_tokens == (7, 1) and case.active_tokens is None and case.tokens == 7
    assert "-t7d7_1-" in case.case_id
    for flags, needle in ((["--dp-tokens", "7"], "dp_tokens: 1 counts (7,) for dp=2"),
                          (["--dp-tokens", "9,1"], "dp_tokens[0]: 9 outside [0, tokens=7]")):
        rc, _, err, _ = _run(capsys, tmp_path, "prefill_c2a_full", "--tp", "4", "--dp", "2",
                             "--tokens", "7", *flags)
        assert rc == 2 and needle in err, err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "x", "--dp-tokens", "7;1"])
    assert "comma-separated list of ints" in capsys.readouterr().err
