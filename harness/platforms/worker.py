"""Kernel launches in worker subprocesses.

pypto leaks tens of MB per full-path call, can segfault or abort on unsupported
programs, and must be imported after its environment is configured.  Each launch
therefore runs in a fresh ``python -m harness.platforms.worker <job_dir>`` whose working
directory is ``job_dir`` (inside the run directory), so a crash, a leak or a stray file
stays there.

Protocol (all files in ``job_dir``; no pickled objects):

* ``job.json``          -- written by the parent: kernel spec, config (dataclass fields
  as JSON plus its class path), case, ABI, arch, run mode, rank, caller ``sys.path``.
* ``inputs.safetensors`` -- every ABI tensor by name (outputs pre-filled by the caller).
* ``outputs.safetensors`` -- written by the worker: the ``out`` / ``inout`` tensors.
* ``result.json``       -- written last by the worker: ok, error, timings, cost report.
* ``worker.log``        -- the worker's stdout and stderr; pypto logs go to ``log/``.

A worker that dies without ``result.json`` (signal, abort, os._exit) becomes an error
result naming the exit status and carrying the log path; the caller never crashes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import typing
from pathlib import Path

JOB = "job.json"
INPUTS = "inputs.safetensors"
OUTPUTS = "outputs.safetensors"
RESULT = "result.json"
LOG = "worker.log"


# ---- config <-> JSON (dataclasses of scalars, tuples and nested dataclasses) ----------

def encode_config(config) -> dict:
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config: {type(config).__name__} is not a dataclass")
    cls = type(config)
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "fields": dataclasses.asdict(config)}


def decode_config(data: dict):
    mod, _, qual = data["class"].partition(":")
    cls = importlib.import_module(mod)
    for part in qual.split("."):
        cls = getattr(cls, part)
    return _rebuild(cls, data["fields"])


def _rebuild(cls, values: dict):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        v, hint = values[f.name], hints.get(f.name)
        if dataclasses.is_dataclass(hint) and isinstance(v, dict):
            v = _rebuild(hint, v)
        elif isinstance(v, list):
            v = _tuples(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


# ---- parent side -----------------------------------------------------------------------

def write_job(job_dir: Path, job: dict, tensors: dict) -> None:
    from safetensors.torch import save_file  # noqa: PLC0415

    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / JOB).write_text(json.dumps(job, indent=1, sort_keys=True))
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
              str(job_dir / INPUTS))


def _child_env(drop: tuple[str, ...] = ()) -> dict:
    env = dict(os.environ)
    for key in drop:
        env.pop(key, None)
    paths = [p or os.getcwd() for p in sys.path]
    paths = [p for p in dict.fromkeys(paths) if os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_job(job_dir: Path, timeout: float | None = None, drop_env: tuple[str, ...] = ()
            ) -> dict:
    """Run the worker on ``job_dir``; return its result dict (never raises for its death)."""
    log = job_dir / LOG
    start = time.perf_counter()
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "harness.platforms.worker", str(job_dir)],
                                cwd=job_dir, env=_child_env(drop_env), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            timed_out = True
    wall = time.perf_counter() - start
    result = None
    if (job_dir / RESULT).exists():
        try:
            result = json.loads((job_dir / RESULT).read_text())
        except ValueError:
            result = None
    if result is None or timed_out or (code != 0 and result.get("ok")):
        if timed_out:
            why = f"worker timed out after {timeout:.0f} s"
        elif code < 0:
            why = f"worker killed by signal {signal.Signals(-code).name}"
        else:
            why = f"worker exited with status {code} without a result"
        result = {"ok": False, "error": f"{why}; log tail:\n{_tail(log)}", "timings": {}}
    result.setdefault("timings", {})["worker_wall_s"] = round(wall, 3)
    result["exit_code"] = code
    return result


def read_outputs(job_dir: Path) -> dict:
    from safetensors.torch import load_file  # noqa: PLC0415

    path = job_dir / OUTPUTS
    return load_file(str(path)) if path.exists() else {}


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---- child side ------------------------------------------------------------------------

def _install_hooks(pypto, timings: dict, *, verify_inputs: bool) -> None:
    """Pass the real CPU tensors to the calculator and time compile vs cost model."""
    from pypto import pypto_impl  # noqa: PLC0415
    from pypto.frontend.parser import entry  # noqa: PLC0415
    from pypto.runtime import _pto_verify_datas  # noqa: PLC0415

    from harness.platforms import pypto_env  # noqa: PLC0415

    wrapper = entry.JitCallableWrapper
    if verify_inputs:
        # Stock code copies inputs with CopyToHost, a no-op in the stub runtime, so the
        # interpreter would compute on zeros.  Hand it the CPU tensors themselves.
        def setup_verify_data(pto_tensors):
            if not pypto.get_verify_options().get("enable_pass_verify"):
                return
            pypto_env.load_calculator()
            pypto_impl.SetVerifyData(entry._pto_to_tensor_data(pto_tensors), [],
                                     _pto_verify_datas.get_data())

        wrapper._setup_verify_data = staticmethod(setup_verify_data)

    def timed(name, fn):
        def inner(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - t, 4)
        return inner

    wrapper.compile = timed("compile_s", wrapper.compile)
    wrapper._run_with_cpu = timed("run_s", wrapper._run_with_cpu)


def child_main(job_dir: Path) -> int:
    timings: dict[str, float] = {}
    result: dict = {"ok": False, "error": None, "timings": timings, "cost": None}
    t_all = time.perf_counter()
    try:
        job = json.loads((job_dir / JOB).read_text())
        sim = job["run_mode"] == "sim"
        from harness.platforms import pypto_env  # noqa: PLC0415

        t = time.perf_counter()
        pypto_env.configure(job_dir, job["arch"])
        pypto = pypto_env.import_pypto(job["arch"])
        _install_hooks(pypto, timings, verify_inputs=sim)
        if sim:
            pypto_env.load_calculator()
            pypto.set_verify_options(enable_pass_verify=True, pass_verify_save_tensor=False,
                                     pass_verify_pass_filter=[],
                                     pass_verify_save_tensor_dir=str(job_dir / "verify"))
        timings["setup_s"] = round(time.perf_counter() - t, 4)

        import torch  # noqa: PLC0415
        from safetensors.torch import load_file, save_file  # noqa: PLC0415

        from harness.platforms.base import KernelSpec  # noqa: PLC0415

        spec = KernelSpec.from_json(job["spec"])
        config = decode_config(job["config"])
        inputs = load_file(str(job_dir / INPUTS))
        args = job["args"]
        if not sim:
            import torch_npu  # noqa: F401, PLC0415  (registers the npu device)
        device = "cpu" if sim else f"npu:{job.get('device', job['rank'])}"
        tensors = [inputs[a["name"]].to(device) for a in args]

        t = time.perf_counter()
        module = importlib.import_module(spec.module)
        run_mode = pypto.RunMode.SIM if sim else pypto.RunMode.NPU
        kernel = getattr(module, spec.builder)(config, job["case"],
                                               runtime_options={"run_mode": run_mode},
                                               **dict(spec.options))
        timings["build_s"] = round(time.perf_counter() - t, 4)

        t = time.perf_counter()
        kernel(*tensors)
        if not sim:
            torch.npu.synchronize()
        timings["call_s"] = round(time.perf_counter() - t, 4)

        outs = {a["name"]: tensors[i].cpu().contiguous() for i, a in enumerate(args)
                if a["role"] in ("out", "inout")}
        save_file(outs, str(job_dir / OUTPUTS))
        if sim:
            from harness.platforms.a5sim import read_cost_report  # noqa: PLC0415

            cost = read_cost_report(job_dir / "output")
            result["cost"] = None if cost is None else cost.as_dict()
        result["ok"] = True
    except BaseException:  # noqa: BLE001 - the parent gets every failure as text
        result["error"] = traceback.format_exc()
    timings["worker_s"] = round(time.perf_counter() - t_all, 4)
    tmp = job_dir / (RESULT + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(job_dir / RESULT)
    if result["error"]:
        print(result["error"], file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # pypto's static destructors have crashed at exit before; the result is on disk.
    os._exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    child_main(Path(sys.argv[1]))


# ---- the platforms' launch: one job directory, one worker -----------------------------

def launch_program(job_dir: Path, program, rank: int, tensors, *, arch: str, run_mode: str,
                   timeout: float | None, drop_env: tuple[str, ...] = (),
                   device: int | None = None):
    """Write the job, run the worker, read its outputs; a ``LaunchResult`` in every case."""
    from harness.platforms import pypto_env  # noqa: PLC0415
    from harness.platforms.base import CostReport, LaunchResult  # noqa: PLC0415

    job = {
        "spec": program.spec.to_json(),
        "config": encode_config(program.config),
        "case": program.case,
        "args": [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "role": a.role}
                 for a in program.args],
        "arch": arch,
        "run_mode": run_mode,
        "rank": rank,
        "device": rank if device is None else device,
    }
    write_job(job_dir, job, {a.name: tensors[a.name] for a in program.args})
    res = run_job(job_dir, timeout=timeout, drop_env=drop_env)
    ok = bool(res.get("ok"))
    outputs = read_outputs(job_dir) if ok else {}
    if ok and not pypto_env.keep_run_dir():  # keep logs and result.json, drop bulk
        import shutil  # noqa: PLC0415

        shutil.rmtree(job_dir / "output", ignore_errors=True)
        shutil.rmtree(job_dir / "verify", ignore_errors=True)
        (job_dir / INPUTS).unlink(missing_ok=True)
        (job_dir / OUTPUTS).unlink(missing_ok=True)
    return LaunchResult(ok=ok, outputs=outputs,
                        cost=CostReport(**res["cost"]) if res.get("cost") else None,
                        timings=res.get("timings", {}), error=res.get("error"),
                        log_path=job_dir / LOG, run_dir=job_dir, rank=rank)
