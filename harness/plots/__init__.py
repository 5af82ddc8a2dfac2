"""Pictures for kernel engineers: the bench's roofline chart and error plots of failing cases.

``roofline`` draws ``python -m harness.bench --plot``; ``errors`` draws the per-output
error plots of ``python -m harness.replay --plot`` and ``python -m harness run --save-data
--plot`` from what ``capture`` records while an entry's comparison runs.  matplotlib is
imported only inside these functions, with the Agg backend (no display), so nothing here
costs anything unless a plot is asked for.

Every figure is saved with the numbers it draws, read back from its artists, embedded in
the file (PNG text chunk or SVG description, key :data:`DATA_KEY`); :func:`read_plot_data`
returns them, so a test or a script can check a picture against the JSON or the verdicts.
"""

from __future__ import annotations

import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path

FORMATS = (".png", ".svg")
DATA_KEY = "v41-plot-data"
_SVG_DESC = "Description"  # the SVG metadata key matplotlib writes as <dc:description>
INSTALL_HINT = "pip install -e '.[plot]'"


class PlotError(ValueError):
    """A plot that cannot be drawn: a bad path, matplotlib missing, or recorded data that
    disagrees with the verdicts."""


def require_matplotlib(flag: str = "--plot") -> None:
    """Raise PlotError naming ``flag`` when matplotlib is not installed (checked before
    any work, without importing it)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotError(f"{flag}: needs matplotlib, which is not installed ({INSTALL_HINT})")


def check_image_path(path: str | Path, flag: str = "--plot") -> Path:
    """``path`` as a Path if it ends in .png or .svg, else PlotError naming ``flag``."""
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise PlotError(f"{flag}: {str(path)!r} must end in {' or '.join(FORMATS)}")
    if p.exists() and p.is_dir():
        raise PlotError(f"{flag}: {str(path)!r} is a directory, not an image file")
    return p


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported here, on first use)."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path, data: dict) -> Path:
    """Write ``fig`` to ``path`` (.png or .svg, parents created) with ``data`` embedded as
    JSON, close it and return the path."""
    path = check_image_path(path, "plot file")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, allow_nan=False)
    key = DATA_KEY if path.suffix.lower() == ".png" else _SVG_DESC
    try:
        fig.savefig(path, dpi=110, metadata={key: text})
    finally:
        pyplot().close(fig)
    return path


def read_plot_data(path: str | Path) -> dict:
    """The data embedded by :func:`save_figure` in a PNG or SVG file; PlotError if absent."""
    path = Path(path)
    if path.suffix.lower() == ".png":
        from PIL import Image
        with Image.open(path) as im:
            text = im.text.get(DATA_KEY)
    else:
        ns = {"dc": "http://purl.org/dc/elements/1.1/"}
        node = ET.parse(path).getroot().find(".//dc:description", ns)
        text = node.text if node is not None else None
    if text is None:
        raise PlotError(f"{path}: no embedded plot data ({DATA_KEY})")
    return json.loads(text)
