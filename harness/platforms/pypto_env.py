"""Tame pypto 0.2.0's process environment before it is imported.

pypto writes compiler output, verifier dumps, run files and logs into the working
directory, ``~/.pypto`` and ``~/ascend/log``; it rebuilds its calculator (the torch-backed
graph interpreter) with cmake in every process; and it reads its compile target from
``<package>/lib/configs/A2A3.ini`` and its cost-model settings from
``TILEFWK_CONFIG_PATH`` once, at import / first use.  This module fixes all of that:

* :func:`make_run_dir` -- one run directory (a temp dir outside the repository unless
  ``V41_RUN_DIR`` names one) that receives every file pypto writes.  It is removed by
  :func:`cleanup_run_dir` unless ``V41_KEEP_RUN_DIR=1``.
* :func:`configure` -- points ``TILE_FWK_OUTPUT_DIR``, ``PYPTO_HOME``,
  ``ASCEND_PROCESS_LOG_PATH`` at the run directory, selects the A5 cost-model json
  (``TILEFWK_CONFIG_PATH``), puts the A5 package overlay first on ``sys.path`` and
  pypto's host control-flow compiles behind a cache (:mod:`harness.platforms.gxx_cache`).
  Must run before the first ``import pypto`` of the process.
* The A5 json turns pypto's vector fusion off (``global.pass.enable_vf``): its
  TuneSyncForVF pass fails on gathers in most tilings (``Cannot find GATHER in PIPE_MTE2``)
  and the cost model's estimates do not depend on it (every TINY gate case the same to the
  last digit).  A card compile from this json is therefore not vector-fused either.
* :func:`package_overlay` -- a cached copy of the installed ``pypto`` package made of
  symlinks, except ``lib/configs/A2A3.ini`` which is replaced by the Ascend 950
  (DAV_3510) platform ini vendored in ``data/``.
* :func:`load_calculator` -- builds ``libtile_fwk_calculator.so`` once per machine
  (torch and pypto versions in the key) under the cache and dlopens it.

The cache lives in ``$V41_A5SIM_CACHE`` (default ``~/.cache/v41-a5sim``), never in the
repository.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from harness.platforms import gxx_cache

DATA_DIR = Path(__file__).resolve().parent / "data"
A5_PLATFORM_INI = DATA_DIR / "Ascend950PR_9579.ini"
A5_COSTMODEL_JSON = DATA_DIR / "tile_fwk_config_a5_quiet.json"
ARCHES = ("a5", "a2a3")

ENV_CACHE = "V41_A5SIM_CACHE"
ENV_RUN_DIR = "V41_RUN_DIR"
ENV_KEEP = "V41_KEEP_RUN_DIR"


class PyptoEnvError(RuntimeError):
    """pypto cannot be set up as requested (wrong import order, build failure, ...)."""


def cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE, "~/.cache/v41-a5sim")).expanduser()


def keep_run_dir() -> bool:
    return os.environ.get(ENV_KEEP, "") not in ("", "0", "false", "False")


def installed_pypto_dir() -> Path:
    """The installed package directory, found without importing pypto."""
    spec = importlib.util.find_spec("pypto")
    if spec is None or spec.origin is None:
        raise PyptoEnvError("pypto: package not installed (pip install pypto==0.2.0)")
    here = Path(spec.origin).resolve().parent
    try:
        return Path(str(metadata.distribution("pypto").locate_file("pypto"))).resolve()
    except metadata.PackageNotFoundError:
        return here


def _versions() -> str:
    return f"pypto{metadata.version('pypto')}"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def package_overlay(arch: str = "a5") -> Path | None:
    """Directory to put first on ``sys.path`` so ``import pypto`` compiles for ``arch``.

    ``a2a3`` is the stock package (returns None).  ``a5`` is an overlay of symlinks into
    the installed package whose ``lib/configs/A2A3.ini`` is the DAV_3510 ini.
    """
    if arch not in ARCHES:
        raise PyptoEnvError(f"arch: {arch!r} is not one of {ARCHES}")
    if arch == "a2a3":
        return None
    ini = A5_PLATFORM_INI.read_bytes()
    key = f"{_versions()}-{hashlib.sha256(ini).hexdigest()[:12]}"
    root = cache_root() / "overlay" / key
    marker = root / ".complete"
    if marker.exists():
        return root
    with _locked(cache_root() / "overlay" / f".{key}.lock"):
        if marker.exists():
            return root
        src = installed_pypto_dir()
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root.parent))
        dst = tmp / "pypto"
        dst.mkdir()
        for entry in src.iterdir():
            if entry.name == "__pycache__":
                continue
            if entry.name != "lib":
                (dst / entry.name).symlink_to(entry)
        (dst / "lib").mkdir()
        for entry in (src / "lib").iterdir():
            if entry.name != "configs":
                (dst / "lib" / entry.name).symlink_to(entry)
        (dst / "lib" / "configs").mkdir()
        for entry in (src / "lib" / "configs").iterdir():
            if entry.name != "A2A3.ini":
                (dst / "lib" / "configs" / entry.name).symlink_to(entry)
        (dst / "lib" / "configs" / "A2A3.ini").write_bytes(ini)
        (tmp / ".complete").write_text(str(src) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    return root


def make_run_dir(prefix: str = "v41-a5sim-") -> Path:
    """A fresh run directory: ``$V41_RUN_DIR/<unique>`` or a system temp dir."""
    base = os.environ.get(ENV_RUN_DIR)
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base or None))


def cleanup_run_dir(run_dir: Path, force: bool = False) -> None:
    if force or not keep_run_dir():
        shutil.rmtree(run_dir, ignore_errors=True)


def run_env(run_dir: Path, arch: str = "a5") -> dict[str, str]:
    """Environment variables that route every pypto side effect into ``run_dir``."""
    run_dir = Path(run_dir)
    env = {
        "TILE_FWK_OUTPUT_DIR": str(run_dir / "output"),
        "PYPTO_HOME": str(run_dir / "pypto_home"),
        "ASCEND_PROCESS_LOG_PATH": str(run_dir / "log"),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }
    if arch == "a5":
        env["TILEFWK_CONFIG_PATH"] = str(A5_COSTMODEL_JSON)
    return env


def configure(run_dir: Path, arch: str = "a5") -> Path | None:
    """Prepare this process for ``import pypto``; returns the overlay dir (or None).

    Raises :class:`PyptoEnvError` if pypto is already imported from elsewhere, because
    the platform ini and the config json are read once and cannot change afterwards.
    """
    overlay = package_overlay(arch)
    env = run_env(run_dir, arch)
    for sub in ("output", "pypto_home", "log"):
        (Path(run_dir) / sub).mkdir(parents=True, exist_ok=True)
    loaded = sys.modules.get("pypto")
    if loaded is not None:
        where = Path(loaded.__file__).parent
        want = (overlay / "pypto") if overlay else installed_pypto_dir()
        if where != want or os.environ.get("TILEFWK_CONFIG_PATH") != env.get(
                "TILEFWK_CONFIG_PATH"):
            raise PyptoEnvError(
                f"pypto: already imported from {where} before configure(arch={arch!r}); "
                f"import pypto only after harness.platforms.pypto_env.configure()")
    os.environ.update(env)
    gxx_cache.install(cache_root() / "gxx")
    if arch != "a5":
        os.environ.pop("TILEFWK_CONFIG_PATH", None)
    if overlay is not None and str(overlay) not in sys.path:
        sys.path.insert(0, str(overlay))
    return overlay


def import_pypto(arch: str = "a5"):
    """``import pypto`` after :func:`configure`; checks the overlay took effect."""
    import pypto  # noqa: PLC0415  (import order is the point of this module)

    overlay = package_overlay(arch)
    if overlay is not None and Path(pypto.__file__).parent != overlay / "pypto":
        raise PyptoEnvError(f"pypto: imported from {pypto.__file__}, expected the {arch} "
                            f"overlay {overlay}")
    return pypto


def calculator_path() -> Path:
    import torch  # noqa: PLC0415

    key = f"{_versions()}-torch{torch.__version__}".replace("+", "_")
    return cache_root() / "calculator" / key / "install" / "lib" / "libtile_fwk_calculator.so"


def load_calculator() -> Path:
    """Build (once per machine, under a file lock) and dlopen the pypto calculator."""
    from pypto._utils import BuildOnlineManager  # noqa: PLC0415

    mgr = BuildOnlineManager()
    so = calculator_path()
    if mgr.calculator_loaded:
        return so
    if not so.exists():
        build_root = so.parents[2]
        with _locked(build_root.parent / f".{build_root.name}.lock"):
            if not so.exists():
                torch_ctx = mgr._TorchContext()
                cmake_ctx = mgr._CMakeContext()
                ctx = mgr._CMakeContext.CompileContext(
                    src_dir=Path(mgr.pkg_lib_dir, "calculator"), tmp_dir=build_root)
                ctx.cfg_cmd_ext = (
                    f"-DPY3_MOD_TORCH_VERSION={torch_ctx.torch_version}"
                    f" -DPY3_MOD_TORCH_ROOT_PATH={torch_ctx.torch_root_dir}"
                    f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={torch_ctx.torch_c_use_cxx11_abi}")
                ctx.build_job_num = os.cpu_count() or 2
                try:
                    cmake_ctx.compile(ctx=ctx)
                except Exception as exc:  # subprocess.CalledProcessError carries the log
                    detail = getattr(exc, "stderr", "") or ""
                    raise PyptoEnvError(f"calculator: build failed in {build_root}: {exc}\n"
                                        f"{detail[-4000:]}") from exc
                shutil.rmtree(build_root / "build", ignore_errors=True)
            if not so.exists():
                raise PyptoEnvError(f"calculator: build produced no {so}")
    ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    mgr.calculator_loaded = True
    return so
