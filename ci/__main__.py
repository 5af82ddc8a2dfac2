"""``python -m ci`` is ``python -m ci.queue``."""

from ci.queue import cli

cli()
