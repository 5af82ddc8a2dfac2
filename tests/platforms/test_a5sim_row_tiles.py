"""The weight-stationary kernels apply each decoded weight tile to every row tile of a
launch.  Their row tile is the launch's tokens rounded up to 16 (at most 192), so the
interpreter's chunks are one row tile each; here ``rows_per_tile = 16`` makes one launch of
37 tokens run three row tiles, the last one partial, and the result must still equal the
golden."""

import pytest

from harness.case import Case
from harness.entries import index_query, o_proj, qkv_proj_rope, shared_expert
from harness.entries._kernel import run_with
from harness.verdict import all_passed

ENTRIES = {"qkv_proj_rope": (qkv_proj_rope, {"tp": 2}),
           "o_proj": (o_proj, {"tp": 2}),
           "index_query": (index_query, {"active_tokens": 33}),
           "shared_expert": (shared_expert, {"active_tokens": 35})}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_several_row_tiles_in_one_launch_equal_the_golden(numerics, name):
    mod, axes = ENTRIES[name]
    case = Case(entry=name, tokens=37, **axes)
    verdicts, _, _ = run_with(numerics, case, mod.kernel_sut(chunk=64, rows_per_tile=16))
    assert verdicts and all_passed(verdicts), [v.line() for v in verdicts if not v.passed]


def test_a_row_tile_that_is_not_a_multiple_of_16_is_refused():
    from v41.cube_tiles import row_tile
    with pytest.raises(ValueError, match="row_tile: 24 must be a positive multiple of 16"):
        row_tile(37, 192, 24)
    assert row_tile(37, 192) == 48 and row_tile(500, 192) == 192 and row_tile(37, 192, 16) == 16
