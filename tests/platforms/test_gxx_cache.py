"""The g++ cache in front of pypto's host control-flow compiles (harness.platforms.gxx_cache):
a hit gives the bytes the compiler wrote, any change of source, included header or flag is
a miss, failures store nothing, and every other call reaches the real compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.platforms import gxx_cache

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on the PATH")


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    monkeypatch.delenv(gxx_cache.ENV_GXX_CACHE, raising=False)
    bin_dir = gxx_cache.install(tmp_path / "gxx")
    assert bin_dir is not None and os.environ["PATH"].split(os.pathsep)[0] == str(bin_dir)
    return bin_dir / "g++", tmp_path / "gxx" / "store"


def _compile(gxx, src: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(gxx), "-O2", *flags, "-S", str(src), "-o", str(out)],
                          capture_output=True, text=True, check=False)


def _source(tmp_path: Path, name: str, body: str, header: str = "#define K 3\n") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "k.h").write_text(header)
    src = d / "f.cpp"
    src.write_text('#include "k.h"\nint f(int x) { return x * K + ' + body + "; }\n")
    return src


def test_a_hit_gives_the_compilers_bytes_and_a_change_is_a_miss(tmp_path, wrapper):
    gxx, store = wrapper
    a = _source(tmp_path, "a", "1")
    assert _compile(gxx, a, tmp_path / "a1.s").returncode == 0
    assert len(list(store.glob("*.s"))) == 1
    # the same source in another folder (as each launch has): a hit, the same bytes
    b = _source(tmp_path, "b", "1")
    (tmp_path / "b.s").write_text("stale")
    assert _compile(gxx, b, tmp_path / "b.s").returncode == 0
    assert len(list(store.glob("*.s"))) == 1
    real = shutil.which("g++", path=os.pathsep.join(os.environ["PATH"].split(os.pathsep)[1:]))
    subprocess.run([real, "-O2", "-S", str(a), "-o", str(tmp_path / "real.s")], check=True)
    assert (tmp_path / "b.s").read_bytes() == (tmp_path / "real.s").read_bytes()
    # a changed body, a changed included header and a changed flag are each a new entry
    assert _compile(gxx, _source(tmp_path, "c", "2"), tmp_path / "c.s").returncode == 0
    assert _compile(gxx, _source(tmp_path, "d", "1", "#define K 4\n"),
                    tmp_path / "d.s").returncode == 0
    assert _compile(gxx, a, tmp_path / "e.s", "-fPIC").returncode == 0
    assert len(list(store.glob("*.s"))) == 4
    for other in ("c.s", "d.s"):  # compiled, not the stored entry copied
        assert (tmp_path / other).read_bytes() != (tmp_path / "a1.s").read_bytes()


def test_a_failed_compile_fails_and_stores_nothing(tmp_path, wrapper):
    gxx, store = wrapper
    bad = _source(tmp_path, "bad", "undefined_name")
    result = _compile(gxx, bad, tmp_path / "bad.s")
    assert result.returncode != 0 and "undefined_name" in result.stderr
    assert not list(store.iterdir())


def test_other_calls_reach_the_real_compiler(tmp_path, wrapper):
    gxx, store = wrapper
    src = _source(tmp_path, "o", "1")
    obj = tmp_path / "o.o"
    subprocess.run([str(gxx), "-O2", "-c", str(src), "-o", str(obj)], check=True)
    assert obj.stat().st_size > 0 and not list(store.iterdir())
    version = subprocess.run([str(gxx), "--version"], capture_output=True, text=True, check=True)
    assert "g++" in version.stdout or "GCC" in version.stdout


def test_off_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(gxx_cache.ENV_GXX_CACHE, "0")
    path = os.environ.get("PATH", "")
    assert gxx_cache.install(tmp_path / "gxx") is None
    assert os.environ.get("PATH", "") == path and not (tmp_path / "gxx").exists()
