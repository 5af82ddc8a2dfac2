"""Test doubles of the platform interface shared by the a5sim kernel tests."""


class NoLaunch:
    """A platform that fails the test if anything is compiled or launched: host validation
    must refuse bad input before either."""

    def compile(self, *a, **k):
        raise AssertionError("compiled before the host check")

    def launch(self, *a, **k):
        raise AssertionError("launched before the host check")
