"""Synthetic entries and platforms for the CLI, report and pytest-plugin tests.

``fake_kernel`` has an a5sim "kernel" (pure torch, run on a fake platform object);
``fake_alt`` only a golden-alt path; ``fake_scaled`` a kernel that is right on its first
matrix case only (output scaled by 1.1 elsewhere).  Every compare also returns a
``zero_rows`` verdict over no rows, which measures nothing.
"""

from __future__ import annotations

import torch

from harness.case import Case, Support
from harness.compare import check_row_bound, check_zero_rows
from harness.fixtures import randn, sentinel
from harness.registry import Entry, SutOutput

SUPPORT = Support(phase="prefill", tp_sizes=(1, 2), wirings=("replicated",))


def _inputs(cfg, case):
    return {"x": randn((case.tokens, 16), case.seed, "x"),
            "out": sentinel((case.tokens, 16), torch.float32)}


def _golden(cfg, case, inp):
    return {"out": inp["x"] * 2}


def _compare(cfg, case, inp, gold, act):
    none = torch.zeros(case.tokens, dtype=torch.bool)
    return (check_row_bound("out", act["out"], gold["out"])
            + check_zero_rows("out", act["out"], rows=none))


def exact(platform, cfg, case, inp):
    return SutOutput({"out": inp["x"] * 2}, [{"rank": 0, "aicore_e2e_us": 3.25}])


def scaled_after_first(platform, cfg, case, inp):
    scale = 1.0 if case.tokens == MATRIX_TOKENS[0] else 1.1
    return SutOutput({"out": inp["x"] * 2 * scale}, [{"rank": 0, "aicore_e2e_us": 3.25}])


MATRIX_TOKENS = (4, 8, 16)


def entry(name: str, *, kernel=None, alternate=None, tps=(1,)) -> Entry:
    matrix = tuple(Case(entry=name, tokens=t, tp=tp) for tp in tps for t in MATRIX_TOKENS)
    return Entry(name=name, description=f"synthetic {name}", support=SUPPORT, matrix=matrix,
                 build_inputs=_inputs, golden=_golden, compare=_compare,
                 kernels={"a5sim": kernel} if kernel else {}, alternate=alternate,
                 alternate_label=name if alternate else "")


def fakes() -> dict[str, Entry]:
    return {e.name: e for e in (
        entry("fake_kernel", kernel=exact, tps=(1, 2)),
        entry("fake_alt", alternate=exact, tps=(1, 2)),
        entry("fake_scaled", kernel=scaled_after_first))}


class FakePlatform:
    """Stands in for a5sim: available or not, with a reason."""

    def __init__(self, ok: bool = True, why: str = ""):
        self.ok, self.why = ok, why

    def available(self) -> tuple[bool, str]:
        return self.ok, self.why

    def close(self) -> None:
        pass


def use_fakes(monkeypatch, *, platform_ok: bool = True) -> dict[str, Entry]:
    """Make the registry hold only the fake entries and a5sim a :class:`FakePlatform`."""
    from harness import registry, runner
    entries = fakes()
    monkeypatch.setattr(registry, "entries", lambda: dict(entries))
    why = "" if platform_ok else "a5sim: pypto calculator missing (test)"
    monkeypatch.setattr(runner, "load_platform",
                        lambda name, devices=None: FakePlatform(platform_ok, why))
    return entries
