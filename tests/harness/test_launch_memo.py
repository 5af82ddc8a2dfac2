"""The decode leaves' launch reuse (``attention_kernels.RankLauncher`` + ``LaunchMemo``):
a computed launch is reused only for identical input bytes; an estimate-only launch is
reused by shape and hands back nothing computed.  Launch-free: a counting platform."""

import torch

from goldens.config import TINY
from harness.entries.attention_kernels import (ROW_SENTINEL, SENTINEL, LaunchMemo, RankLauncher,
                                               launch_key)
from harness.platforms.base import CostReport, LaunchResult, Platform


class Counting(Platform):
    """Compiles through the base class (the module's ABI); each launch returns ``y = 1``
    and a cost record of ``7 + launches`` microseconds."""

    name = "a5sim"

    def __init__(self):
        self.launches = 0

    def available(self):
        return True, ""

    def launch(self, program, rank, tensors):
        self.launches += 1
        y = torch.ones_like(tensors["y"])
        return LaunchResult(True, {"y": y}, CostReport(7.0 + self.launches, 1), rank=rank)


def _args(seed: int, tokens: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(tokens, TINY.hidden_size, generator=g).bfloat16(),
            "weight": torch.randn(TINY.hidden_size, generator=g).bfloat16()}


def _launcher(platform, memo, rank=0):
    return RankLauncher(platform, TINY, rank=rank, preset="tiny", memo=memo)


def test_computed_launches_are_reused_only_for_the_same_bytes():
    plat, memo = Counting(), LaunchMemo()
    first = _launcher(plat, memo)("v41.rmsnorm", {"tokens": 3}, _args(1))
    again = _launcher(plat, memo)("v41.rmsnorm", {"tokens": 3}, _args(1))
    assert plat.launches == 1 and torch.equal(first["y"], again["y"])
    _launcher(plat, memo)("v41.rmsnorm", {"tokens": 3}, _args(2))
    assert plat.launches == 2


def test_estimate_launches_are_reused_by_shape_and_return_nothing_computed():
    plat, memo = Counting(), LaunchMemo(by_shape=True)
    a = _launcher(plat, memo)
    a("v41.rmsnorm", {"tokens": 3}, _args(1))
    b = _launcher(plat, memo)
    out = b("v41.rmsnorm", {"tokens": 3}, _args(2))  # other data, same shapes: reused
    assert plat.launches == 1
    assert b.records == a.records == [{"rank": 0, "aicore_e2e_us": 8.0, "total_cycles": 1,
                                       "module": "v41.rmsnorm"}]
    assert b.cost()[0]["by_module"] == {"v41.rmsnorm": 8.0}
    assert torch.all(out["y"].float() == SENTINEL)  # not the first launch's outputs
    _launcher(plat, memo)("v41.rmsnorm", {"tokens": 4}, _args(1, tokens=4))  # new shape
    assert plat.launches == 2
    other = _launcher(plat, memo, rank=3)
    other("v41.rmsnorm", {"tokens": 3}, _args(5))
    assert plat.launches == 2 and other.records[0]["rank"] == 3  # booked to its own rank


def test_shape_keys_ignore_payload_bytes_but_not_metadata_shapes_dtypes_or_axes():
    k = lambda args, axes={"tokens": 3}, data=False: launch_key("m", axes, None, args, data=data)  # noqa: E731
    assert k(_args(1)) == k(_args(2)) and k(_args(1), data=True) != k(_args(2), data=True)
    assert k(_args(1)) != k(_args(1, tokens=4))
    assert k(_args(1)) != k({**_args(1), "x": _args(1)["x"].float()})
    assert k(_args(1)) != k(_args(1), axes={"tokens": 3, "tp": 2})
    count = {"num_tokens": torch.tensor([3], dtype=torch.int32)}
    assert k({**_args(1), **count}) != k({**_args(1), "num_tokens": torch.tensor([2], dtype=torch.int32)})
    assert ROW_SENTINEL < 0  # integer outputs of an uncomputed launch read as "no row"


def test_each_verify_level_and_numerics_only_have_their_own_memo():
    from harness.entries.attention_kernels import ESTIMATE_MEMO, MEMO, launch_memo

    class P:
        name, estimate_only = "a5sim", False

        def __init__(self, level, cost_model=True):
            self.verify_level, self.cost_model = level, cost_model

    tensor, lowered = launch_memo(P("tensor")), launch_memo(P("lowered"))
    assert tensor is MEMO and lowered is not MEMO and lowered is launch_memo(P("lowered"))
    # a launch without the cost model has no estimate: it never stands in for one with it
    bare = launch_memo(P("tensor", cost_model=False))
    assert bare not in (MEMO, lowered) and bare is launch_memo(P("tensor", cost_model=False))
    assert launch_memo(P("lowered", cost_model=False)) not in (bare, lowered)
    est = P("cost")
    est.estimate_only = True
    assert launch_memo(est) is ESTIMATE_MEMO and ESTIMATE_MEMO.by_shape
