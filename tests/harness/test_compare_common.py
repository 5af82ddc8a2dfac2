"""harness.compare._common: row selections, labels, byte views, rel-L2 conventions."""

import math

import numpy as np
import pytest
import torch

from harness.compare._common import changed_elements, element_bytes, rel_l2, row_labels, row_mask, row_rel_l2


def test_row_selection_forms_agree():
    expect = np.array([False, True, True, False, True])
    assert (row_mask("o", [1, 2, 4, -1], 5) == expect).all()
    assert (row_mask("o", torch.tensor([4, 1, 2]), 5) == expect).all()
    assert (row_mask("o", torch.from_numpy(expect), 5) == expect).all()
    assert (row_mask("o", slice(1, 3), 5) == expect & (np.arange(5) < 3)).all()
    assert row_mask("o", None, 3).all() and not row_mask("o", [], 3).any()


def test_row_selection_misuse_names_the_output():
    with pytest.raises(ValueError, match="kv: row 7 out of range for 5 rows"):
        row_mask("kv", [7], 5)
    with pytest.raises(ValueError, match="kv: row selection must be bool or integer"):
        row_mask("kv", [0.5], 5)


def test_labels_are_ints_or_leading_dim_tuples():
    assert row_labels(np.array([0, 5]), (8,)) == [0, 5]
    assert row_labels(np.array([0, 5]), (2, 4)) == [(0, 0), (1, 1)]


def test_byte_views_cover_fp8_and_multi_byte_dtypes():
    a = torch.tensor([1.0, -0.0], dtype=torch.bfloat16)
    assert element_bytes(a).shape == (2, 2)
    b = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)
    assert changed_elements("o", a, b).tolist() == [False, True]
    f8 = torch.zeros(3, dtype=torch.float8_e4m3fn)
    assert element_bytes(f8).shape == (3, 1)


def test_rel_l2_zero_conventions():
    z = torch.zeros(3)
    assert rel_l2(z, z) == 0.0 and rel_l2(torch.ones(3), z) == math.inf
    r = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    d = torch.tensor([[0.0, 0.0], [0.3, 0.4], [1.0, 0.0]], dtype=torch.float64)
    assert row_rel_l2(d, r).tolist() == [0.0, pytest.approx(0.1), math.inf]
