"""One module per validated entry; each registers itself with :mod:`harness.registry`."""
