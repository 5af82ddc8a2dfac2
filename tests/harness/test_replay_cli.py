"""End to end through the two CLIs with a real kernel: ``python -m harness run rmsnorm
--save-data`` then ``python -m harness.replay`` on the case folder it reports (a5sim); the
README names what the commands write and where the contract documents live."""

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _run(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    runs = tmp_path_factory.mktemp("runs")
    p = _run(["harness", "run", "rmsnorm", "--tokens", "8", "--save-data"], cwd,
             {"V41_RUN_DIR": str(runs)})
    summary = cwd / "out" / "summary.json"
    cases = json.loads(summary.read_text())["cases"] if summary.is_file() else []
    if cases and cases[0]["status"] == "skip":
        pytest.skip(f"rmsnorm on a5sim skipped: {cases[0]['reason']}")
    assert p.returncode == 0, p.stdout + p.stderr
    return cwd, runs


def test_a_run_writes_only_out_summary_and_out_data_in_the_working_directory(saved):
    cwd, runs = saved
    assert sorted(os.listdir(cwd)) == ["out"]
    assert sorted(os.listdir(cwd / "out")) == ["data", "summary.json"]
    assert os.listdir(runs) == []  # the a5sim run directory is removed after the run


def test_the_reported_case_folder_replays_and_reruns(saved):
    cwd, _ = saved
    [case] = json.loads((cwd / "out" / "summary.json").read_text())["cases"]
    assert case["sut"] == "kernel:rmsnorm" and case["status"] == "pass"
    folder = case["data_dir"]
    assert folder.startswith("out/data/replicated/")
    manifest = json.loads((cwd / folder / "manifest.json").read_text())
    assert (manifest["sut"], manifest["sut_label"]) == ("kernel", "kernel:rmsnorm")
    level = manifest["verify_level"]
    assert isinstance(level, str) and level  # a kernel ran on a5sim at a verify level
    plain = _run(["harness.replay", folder], cwd)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "mode: replay" in plain.stdout and "1 passed, 0 failed" in plain.stdout
    assert f" {level} " in plain.stdout
    rerun = _run(["harness.replay", folder, "--rerun"], cwd)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "mode: rerun" in rerun.stdout and "identical" in rerun.stdout
    other = _run(["harness.replay", "out/data", "--wiring", "sharded"], cwd)
    assert other.returncode == 1 and "no saved cases under out/data/sharded" in other.stderr


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_names_every_default_path_the_commands_write():
    from goldens.run_model import DEFAULT_CACHE
    from harness.cli import build_parser
    from harness.platforms import pypto_env
    text = README.read_text()
    args = build_parser().parse_args(["run", "rmsnorm", "--save-data"])
    run_dir_prefix = inspect.signature(pypto_env.make_run_dir).parameters["prefix"].default
    for path in (args.summary, f"{args.save_data}/<wiring>/<case>/",
                 f"{DEFAULT_CACHE}/<preset>-seed<seed>/", f"$TMPDIR/{run_dir_prefix}*/",
                 "~/.cache/v41-a5sim/", "v41_flash_a5.egg-info/", ".hypothesis/"):
        assert f"`{path}" in text, path
    assert pypto_env.cache_root() == Path(os.environ.get(pypto_env.ENV_CACHE,
                                                         "~/.cache/v41-a5sim")).expanduser()
    for var in (pypto_env.ENV_CACHE, pypto_env.ENV_RUN_DIR, pypto_env.ENV_KEEP):
        assert f"${var}" in text or f"`{var}=" in text, var


def test_the_readme_spec_links_point_beside_the_clone_and_say_so():
    text = README.read_text()
    links = sorted(set(re.findall(r"`(\.\./shared/[^`]+)`", text)))
    assert "../shared/spec/v41-flash-contract.md" in links
    assert "../shared/spec/reference-facts.md" in links
    assert "A clone on its own does not have them" in text
    shared = README.parent.parent / "shared"
    if not shared.is_dir():
        pytest.skip(f"{shared} is absent (a lone clone): link targets cannot be checked")
    missing = [link for link in links if not (README.parent / link).exists()]
    assert not missing, missing
