"""Kernel launches in worker subprocesses.

pypto leaks tens of MB per full-path call, can segfault or abort on unsupported
programs, and must be imported after its environment is configured.  Launches therefore
run in a worker process, ``python -m harness.platforms.worker --serve HOME ARCH MODE``,
that reads job directories from its stdin one at a time (:class:`Worker`): pypto stays
imported, the calculator loaded and built kernels cached between the launches of one
platform, and the worker is replaced after ``V41_WORKER_JOBS`` launches (default 16) or
any failure.  A worker dies with the process that started it and never writes into the
repository (:mod:`harness.platforms.lifeline`).

Protocol (all files in ``job_dir``; no pickled objects):

* ``job.json``          -- written by the parent: kernel spec, config (dataclass fields
  as JSON plus its class path), case, ABI, arch, run mode, rank, verify level.
* ``inputs.safetensors`` -- every ABI tensor by name (outputs pre-filled by the caller).
* ``outputs.safetensors`` -- written by the worker: the ``out`` / ``inout`` tensors.
* ``result.json``       -- written last by the worker: ok, error, timings, cost report,
  details (verify summary, worker pid and job number, kernel cache hit).
* ``worker.log``        -- the worker's stdout and stderr during this job; ``pypto.log``
  the pypto log lines of this job; ``output/`` pypto's output of this job.

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
ENV_WORKER_JOBS = "V41_WORKER_JOBS"
DEFAULT_WORKER_JOBS = 16


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


def max_jobs_from_env() -> int:
    """Launches one worker serves before it is replaced (``V41_WORKER_JOBS``, default 16)."""
    text = os.environ.get(ENV_WORKER_JOBS, "") or str(DEFAULT_WORKER_JOBS)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_WORKER_JOBS}: {text!r} must be an int >= 1")
    return value


class Worker:
    """A ``python -m harness.platforms.worker --serve`` process that runs job directories
    one at a time, keeping pypto imported, its calculator loaded and built kernels cached.

    It is replaced after ``max_jobs`` launches (pypto leaks ~31 MB per call) and after any
    failed launch.  Its home (pypto's output, home and log directories) is
    ``root/worker-*``, removed when it stops unless ``V41_KEEP_RUN_DIR=1``.  The worker
    dies with this process (:mod:`harness.platforms.lifeline`).  Not thread-safe: callers
    serialize :meth:`run`.
    """

    def __init__(self, root: Path, *, arch: str, run_mode: str, drop_env: tuple[str, ...] = (),
                 max_jobs: int | None = None):
        self.root = Path(root)
        self.arch, self.run_mode, self.drop_env = arch, run_mode, drop_env
        self.max_jobs = max_jobs_from_env() if max_jobs is None else max_jobs
        self.proc: subprocess.Popen | None = None
        self.home: Path | None = None
        self.jobs = 0  # jobs run by the current process

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def _start(self) -> None:
        import tempfile  # noqa: PLC0415

        from harness.platforms import lifeline  # noqa: PLC0415

        self.root.mkdir(parents=True, exist_ok=True)
        self.home = Path(tempfile.mkdtemp(prefix="worker-", dir=self.root))
        with open(self.home / LOG, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness.platforms.worker", "--serve", str(self.home),
                 self.arch, self.run_mode],
                cwd=self.home, env=_child_env(self.drop_env), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, **lifeline.spawn_kwargs())
        lifeline.janitor().watch_group(self.proc.pid)
        self.jobs = 0

    def run(self, job_dir: Path, timeout: float | None = None) -> dict:
        """Run ``job_dir``; its result dict (never raises for the worker's death)."""
        if self.proc is None or self.proc.poll() is not None:
            self._reap()
            self._start()
        start = time.perf_counter()
        why = None
        try:
            try:
                self.proc.stdin.write(f"{job_dir}\n".encode())
                self.proc.stdin.flush()
                replied = self._wait_reply(timeout)
            except BrokenPipeError:
                replied = False
            if replied is None:
                why = f"worker timed out after {timeout:.0f} s"
                self._kill()
        except BaseException:  # interrupted: never leave the worker running
            self._kill()
            raise
        wall = time.perf_counter() - start
        code = None
        if not replied:
            code = self._reap()
            if why is None:
                if code is not None and code < 0:
                    why = f"worker killed by signal {signal.Signals(-code).name}"
                else:
                    why = f"worker exited with status {code} without a result"
        result = _read_result(job_dir)
        if why is not None and (result is None or result.get("ok")):
            result = {"ok": False, "error": f"{why}; log tail:\n{_tail(job_dir / LOG)}",
                      "timings": {}}
        elif result is None:
            result = {"ok": False, "error": f"worker wrote no {RESULT}; log tail:\n"
                                            f"{_tail(job_dir / LOG)}", "timings": {}}
        result.setdefault("timings", {})["worker_wall_s"] = round(wall, 3)
        result["exit_code"] = code
        self.jobs += 1
        if not result.get("ok") or self.jobs >= self.max_jobs:
            self.close()
        return result

    def _wait_reply(self, timeout: float | None) -> bool | None:
        """True on the worker's reply line, False on EOF (it died), None on timeout."""
        import selectors  # noqa: PLC0415

        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left == 0.0 or not sel.select(left):
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    return False
                buf += chunk
        return True

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self) -> int | None:
        """Wait for the (dead or closing) worker; its exit code; forget it and its home."""
        if self.proc is None:
            return None
        from harness.platforms import lifeline, pypto_env  # noqa: PLC0415

        proc, self.proc = self.proc, None
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        lifeline.janitor().forget_group(proc.pid)
        if self.home is not None:
            pypto_env.cleanup_run_dir(self.home)
            self.home = None
        return code

    def close(self) -> None:
        """Stop the worker: EOF on its job pipe, then wait (killed after 60 s)."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._reap()


def _read_result(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / RESULT).read_text())
    except (OSError, ValueError):
        return None


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

def _install_hooks(pypto, timings: dict, *, verify_inputs: bool,
                   state: dict | None = None) -> None:
    """Pass the real CPU tensors to the calculator and time compile vs cost model.
    ``timings`` is the dict every later call accumulates into (cleared per job);
    ``state["cost_model"]`` False (set per job) skips the cost model (:func:`_copy_back_only`)."""
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

    def timed(name, fn, cpu_name=None):
        # cpu_name: also the process's CPU seconds (all threads), which a loaded machine
        # does not inflate the way it inflates wall seconds
        def inner(*args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - t, 4)
                if cpu_name:
                    timings[cpu_name] = round(
                        timings.get(cpu_name, 0.0) + time.process_time() - c, 4)
        return inner

    wrapper.compile = timed("compile_s", wrapper.compile, "compile_cpu_s")
    run = wrapper._run_with_cpu
    if verify_inputs and state is not None:
        run = _copy_back_only(pypto, run, state)
    wrapper._run_with_cpu = timed("run_s", run)


def _copy_back_only(pypto, run_with_cpu, state: dict):
    """``_run_with_cpu`` that, while ``state["cost_model"]`` is False, copies the
    interpreter's results into the kernel's tensors without running the cost model.

    pypto 0.2.0's ``CostModelRunOnceDataFromHost`` runs the model only while the runtime's
    run mode is SIM and copies the interpreted tensors back afterwards either way; with the
    run mode NPU for that one call only the copy-back happens (the same output bits, no
    estimate: ``tests/platforms/test_a5sim_numerics_only.py``)."""
    def run(self, in_tensors, out_tensors):
        if state.get("cost_model", True):
            return run_with_cpu(self, in_tensors, out_tensors)
        pypto.set_options(runtime_options={"run_mode": pypto.RunMode.NPU})
        try:
            return run_with_cpu(self, in_tensors, out_tensors)
        finally:
            pypto.set_options(runtime_options={"run_mode": pypto.RunMode.SIM})
    return run


class _Session:
    """pypto set up once in this worker process; runs job directories one by one."""

    def __init__(self, home: Path, arch: str, run_mode: str):
        self.home, self.arch, self.run_mode = home, arch, run_mode
        self.sim = run_mode == "sim"
        self.pypto = None
        self.timings: dict[str, float] = {}
        self.state: dict = {"cost_model": True}  # per job, read by the run hook
        self.kernels: dict[str, object] = {}
        self.jobs = 0

    def _setup(self) -> None:
        from harness.platforms import pypto_env  # noqa: PLC0415

        t = time.perf_counter()
        pypto_env.configure(self.home, self.arch)
        pypto = pypto_env.import_pypto(self.arch)
        _install_hooks(pypto, self.timings, verify_inputs=self.sim, state=self.state)
        if self.sim:
            pypto_env.load_calculator()
        self.pypto = pypto
        self.timings["setup_s"] = round(time.perf_counter() - t, 4)

    def _kernel(self, spec, config, job) -> tuple[object, bool]:
        """The built kernel for (spec, config, case), from this worker's cache if present."""
        key = json.dumps([job["spec"], job["config"], job["case"]], sort_keys=True)
        if key in self.kernels:
            return self.kernels[key], True
        module = importlib.import_module(spec.module)
        run_mode = self.pypto.RunMode.SIM if self.sim else self.pypto.RunMode.NPU
        kernel = getattr(module, spec.builder)(config, job["case"],
                                               runtime_options={"run_mode": run_mode},
                                               **dict(spec.options))
        self.kernels[key] = kernel
        return kernel, False

    def run(self, job_dir: Path) -> dict:
        timings = self.timings
        timings.clear()
        self.jobs += 1
        result: dict = {"ok": False, "error": None, "timings": timings, "cost": None,
                        "details": {"worker_pid": os.getpid(), "worker_job": self.jobs}}
        t_all = time.perf_counter()
        try:
            job = json.loads((job_dir / JOB).read_text())
            if (job["arch"], job["run_mode"]) != (self.arch, self.run_mode):
                raise RuntimeError(f"job for {job['arch']}/{job['run_mode']} sent to a worker "
                                   f"for {self.arch}/{self.run_mode}")
            if self.pypto is None:
                self._setup()
            self._run(job_dir, job, result)
        except BaseException:  # noqa: BLE001 - the parent gets every failure as text
            result["ok"] = False
            result["error"] = (result["error"] + "\n" if result["error"] else "") + \
                traceback.format_exc()
        timings["worker_s"] = round(time.perf_counter() - t_all, 4)
        result["timings"] = dict(timings)
        tmp = job_dir / (RESULT + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.rename(job_dir / RESULT)
        if result["error"]:
            print(result["error"], file=sys.stderr)
        return result

    def _run(self, job_dir: Path, job: dict, result: dict) -> None:
        import torch  # noqa: PLC0415
        from safetensors.torch import load_file, save_file  # noqa: PLC0415

        from harness.platforms import verify  # noqa: PLC0415
        from harness.platforms.base import KernelSpec  # noqa: PLC0415

        pypto, timings, sim = self.pypto, self.timings, self.sim
        os.chdir(job_dir)  # a stray file of pypto's lands in this job's folder
        level = job.get("verify") or verify.DEFAULT_LEVEL
        if sim:
            pypto.set_verify_options(**verify.verify_options(level, job_dir / "verify"))
        self.state["cost_model"] = job.get("cost_model", True)
        result["details"]["cost_model"] = self.state["cost_model"]
        spec = KernelSpec.from_json(job["spec"])
        config = decode_config(job["config"])
        inputs = load_file(str(job_dir / INPUTS))
        args = job["args"]
        if not sim:
            import torch_npu  # noqa: F401, PLC0415  (registers the npu device)
        device = "cpu" if sim else f"npu:{job.get('device', job['rank'])}"
        tensors = [inputs[a["name"]].to(device) for a in args]

        t = time.perf_counter()
        kernel, cached = self._kernel(spec, config, job)
        timings["build_s"] = round(time.perf_counter() - t, 4)
        result["details"]["kernel_cached"] = cached

        out_root = self.home / "output"
        before = set(out_root.glob("output_*"))
        cursor = verify.LogCursor(self.home / "log")
        t = time.perf_counter()
        kernel(*tensors)
        if not sim:
            torch.npu.synchronize()
        timings["call_s"] = round(time.perf_counter() - t, 4)
        log_text = cursor.read_new()
        (job_dir / "pypto.log").write_text(log_text)
        (job_dir / "output").mkdir(exist_ok=True)
        for run in sorted(set(out_root.glob("output_*")) - before):
            run.rename(job_dir / "output" / run.name)

        outs = {a["name"]: tensors[i].cpu().contiguous() for i, a in enumerate(args)
                if a["role"] in ("out", "inout")}
        save_file(outs, str(job_dir / OUTPUTS))
        if sim:
            from harness.platforms.a5sim import read_cost_report  # noqa: PLC0415

            cost = read_cost_report(job_dir / "output")
            result["cost"] = None if cost is None else cost.as_dict()
            summary = verify.summarize(verify.parse_verdicts(log_text), level)
            result["details"]["verify"] = summary
            if summary["error"]:
                result["error"] = f"{summary['error']} (log: {job_dir / 'pypto.log'})"
                return
        result["ok"] = True


def _redirect_output(path: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _release_memory() -> None:
    """Hand freed interpreter memory back to the system between jobs (a FLASH-shape call
    can peak at several GB; an idle worker should not keep it)."""
    import ctypes  # noqa: PLC0415
    import gc  # noqa: PLC0415

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def serve(home: Path, arch: str, run_mode: str) -> None:
    """Read job directories from stdin, one a line; run each, then reply with its line on
    the original stdout.  EOF on stdin ends the worker."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    _redirect_output(home / LOG)
    session = _Session(home, arch, run_mode)
    for line in sys.stdin:
        job_dir = Path(line.strip())
        if not line.strip():
            continue
        _redirect_output(job_dir / LOG)
        session.run(job_dir)
        _redirect_output(home / LOG)
        _release_memory()
        reply.write(f"{job_dir}\n")
    reply.flush()
    # pypto's static destructors have crashed at exit before; every result is on disk.
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "--serve":
        sys.exit("usage: python -m harness.platforms.worker --serve HOME ARCH RUN_MODE")
    serve(Path(sys.argv[2]), sys.argv[3], sys.argv[4])


# ---- the platforms' launch: one job directory, one worker -----------------------------

def launch_program(job_dir: Path, program, rank: int, tensors, *, arch: str, run_mode: str,
                   timeout: float | None, drop_env: tuple[str, ...] = (),
                   device: int | None = None, verify: str | None = None,
                   cost_model: bool = True,
                   worker: Worker | None = None):
    """Write the job, run it on ``worker`` (or a one-launch worker), read its outputs; a
    ``LaunchResult`` in every case.  Bulk files (pypto output, verify dumps, tensors) are
    deleted afterwards unless ``V41_KEEP_RUN_DIR=1``."""
    import shutil  # noqa: PLC0415

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
        "verify": verify,
        "cost_model": cost_model,
    }
    write_job(job_dir, job, {a.name: tensors[a.name] for a in program.args})
    owned = worker is None
    if owned:
        worker = Worker(job_dir, arch=arch, run_mode=run_mode, drop_env=drop_env, max_jobs=1)
    try:
        res = worker.run(job_dir, timeout=timeout)
    finally:
        if owned:
            worker.close()
    ok = bool(res.get("ok"))
    outputs = read_outputs(job_dir) if ok else {}
    if not pypto_env.keep_run_dir():  # keep logs and result.json, drop bulk
        shutil.rmtree(job_dir / "verify", ignore_errors=True)
        if ok:
            shutil.rmtree(job_dir / "output", ignore_errors=True)
            (job_dir / INPUTS).unlink(missing_ok=True)
            (job_dir / OUTPUTS).unlink(missing_ok=True)
    return LaunchResult(ok=ok, outputs=outputs,
                        cost=CostReport(**res["cost"]) if res.get("cost") else None,
                        timings=res.get("timings", {}), error=res.get("error"),
                        log_path=job_dir / LOG, run_dir=job_dir, rank=rank,
                        details=res.get("details") or {})
