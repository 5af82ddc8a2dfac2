"""Bad ``ci.queue`` flags are refused up front by argparse (exit 2), naming the flag."""

from __future__ import annotations

import pytest

from ci import queue


@pytest.mark.parametrize("flag,value", [
    ("--cards", "0"), ("--cards", "-1"), ("--cards", "2.5"),
    ("--jobs", "0"), ("--jobs", "-3"),
    ("--timeout", "0"), ("--timeout", "-5"), ("--timeout", "nan"), ("--timeout", "inf"),
    ("--kill-grace", "-1"),
    ("--submit-wait", "0"), ("--submit-wait", "-10"),
    ("--devices", "0,1,1"), ("--devices", "0,-1"), ("--devices", ""),
])
def test_bad_values_are_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        queue.parse_args([f"{flag}={value}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and repr(value) in err, err


def test_the_bounds_themselves_are_accepted():
    args = queue.parse_args(["--cards", "1", "--jobs", "1", "--timeout", "0.5",
                             "--kill-grace", "0", "--submit-wait", "0.5"])
    assert (args.cards, args.jobs, args.timeout, args.kill_grace, args.submit_wait) == (
        1, 1, 0.5, 0.0, 0.5)
    assert queue.parse_args(["--devices", "4,0,5"]).devices == [4, 0, 5]


def test_cards_zero_never_reaches_the_pool(project, tmp_path, capsys):
    root = project({"test_a.py": "MARK\ndef test_a():\n    pass\n"})
    with pytest.raises(SystemExit) as e:
        queue.main(["--root", str(root), "--out", str(tmp_path / "o"), "--cards", "0"])
    assert e.value.code == 2 and "--cards" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()   # refused before any collection or run
