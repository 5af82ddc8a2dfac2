"""harness.compare.replicas: TP replicas byte-identical."""

import pytest
import torch

from harness.compare.replicas import check_replicas


def _replicas(n=4, dtype=torch.bfloat16):
    base = torch.randn(6, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    return [base.clone() for _ in range(n)]


def test_identical_replicas_pass():
    [v] = check_replicas("attn_out", _replicas())
    assert v.passed and v.check == "replica_bytes" and v.n_checked == 4


def test_one_byte_in_one_rank_fails_naming_rank_row_and_index():
    reps = _replicas()
    reps[2].view(torch.uint8)[4, 7] ^= 0x01  # element (4, 3) of rank 2
    [v] = check_replicas("attn_out", reps)
    assert not v.passed and v.measured == 1 and v.bound == 0
    assert v.row == (2, 4) and v.failing_rows == ((2, 4),)
    assert "rank 2 differs from rank 0 at flat index 131 (row 4)" in v.detail


def test_negative_zero_counts_as_a_difference_and_all_ranks_are_listed():
    reps = _replicas(dtype=torch.float32)
    for r in reps:
        r[0, 0] = 0.0
    reps[3][0, 0] = -0.0
    reps[1][5, 1] += 1.0
    [v] = check_replicas("attn_out", reps, ranks=[4, 5, 6, 7])
    assert not v.passed and v.measured == 2 and v.failing_rows == ((5, 5), (7, 0))
    assert "differing ranks [5, 7]" in v.detail


def test_misuse_raises():
    with pytest.raises(ValueError, match="attn_out: no replicas"):
        check_replicas("attn_out", [])
    reps = _replicas(2)
    with pytest.raises(ValueError, match="attn_out rank 1 vs rank 0: actual shape"):
        check_replicas("attn_out", [reps[0], reps[1][:3]])
