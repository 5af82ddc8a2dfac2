"""Placeholder expert weights for estimate-only fixtures: same names, shapes and dtypes as
the real fixture, every other tensor unchanged, no memory per expert, and only inside
``weight_placeholders()``."""

import pytest
import torch

from harness import registry
from harness.fixtures import clone_tensors, is_broadcast, placeholders_wanted, weight_placeholders

ROUTED = {"routed_experts": ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"),
          "moe": tuple(f"w.routed.{f}" for f in ("w1", "w1_scale", "w3", "w3_scale", "w2",
                                                 "w2_scale"))}


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_placeholder_fixture_matches_the_real_one_but_for_expert_values(name):
    entry = registry.get(name)
    case = entry.matrix[0]
    real = entry.build_inputs(case.config, case)
    with weight_placeholders():
        fake = entry.build_inputs(case.config, case)
    assert set(fake) == set(real)
    for k in real:
        assert (fake[k].shape, fake[k].dtype) == (real[k].shape, real[k].dtype), k
        if k in ROUTED[name]:
            assert is_broadcast(fake[k]), k
            assert not torch.equal(fake[k], real[k]), k  # values really are placeholders
        else:
            assert torch.equal(fake[k], real[k]), k
    w = fake[ROUTED[name][0]]
    assert w.untyped_storage().nbytes() == w[0].numel()  # one expert's bytes for all E


def test_placeholders_only_inside_the_block_even_after_an_error():
    assert not placeholders_wanted()
    with pytest.raises(RuntimeError):
        with weight_placeholders():
            assert placeholders_wanted()
            raise RuntimeError("boom")
    assert not placeholders_wanted()


def test_clone_keeps_broadcast_views_and_copies_the_rest():
    view = torch.zeros((1, 4), dtype=torch.uint8).expand(3, 4)
    dense = torch.ones((3, 4))
    out = clone_tensors({"view": view, "dense": dense, "one": torch.zeros((1, 4)).expand(1, 4)})
    assert out["view"] is view
    assert out["dense"] is not dense and torch.equal(out["dense"], dense)
    assert out["dense"].untyped_storage().data_ptr() != dense.untyped_storage().data_ptr()
    assert out["one"] is not None and not is_broadcast(out["one"])


def test_rank_arguments_keep_placeholder_weights_as_views():
    """A rank's launch arguments slice the placeholders without copying them: four FLASH
    EP4 ranks' copies were 5.8 GB and pushed the estimate-only bench past 24 GiB."""
    from harness.entries import routed_experts as re_entry

    entry = registry.get("routed_experts")
    case = next(c for c in entry.matrix if re_entry.ranks(c) > 1)
    with weight_placeholders():
        inputs = entry.build_inputs(case.config, case)
    real = entry.build_inputs(case.config, case)
    for rank in range(re_entry.ranks(case)):
        args = re_entry.rank_inputs(case.config, case, rank, inputs)
        dense = re_entry.rank_inputs(case.config, case, rank, real)
        for name in ROUTED["routed_experts"]:
            assert args[name].shape == dense[name].shape, name
            assert args[name].untyped_storage().data_ptr() == \
                inputs[name].untyped_storage().data_ptr(), name
            assert dense[name].is_contiguous(), name
