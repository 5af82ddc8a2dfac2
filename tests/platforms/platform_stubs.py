"""Test doubles of the platform interface shared by the a5sim kernel tests."""


class NoLaunch:
    """A platform that fails the test if anything is compiled or launched: host validation
    must refuse bad input before either."""

    def compile(self, *a, **k):
        raise AssertionError("compiled before the host check")

    def launch(self, *a, **k):
        raise AssertionError("launched before the host check")


def assert_refused_unchanged(entry, case, inputs, match: str) -> None:
    """``entry``'s a5sim SUT refuses ``inputs`` with a ValueError matching ``match`` before
    anything is compiled or launched, and leaves every input byte (and the sentinel-filled
    ``out``) as it was."""
    import pytest
    import torch

    from harness.fixtures import SENTINEL, clone_tensors

    def raw(t):
        return t.view(torch.uint8) if t.element_size() == 1 else t

    before = clone_tensors(inputs)
    with pytest.raises(ValueError, match=match):
        entry.kernels["a5sim"](NoLaunch(), case.config, case, inputs)
    assert bool((inputs["out"] == SENTINEL).all())
    for k, v in before.items():
        assert torch.equal(raw(v), raw(inputs[k])), k
