"""Project layout rules that pytest and the queue runner rely on."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_test_file_names_are_unique():
    # test folders have no __init__.py: two files with one basename cannot both be imported
    names = Counter(p.name for d in ("tests", "cases") for p in (ROOT / d).rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_every_case_file_is_marked_for_the_queue_runner():
    unmarked = [p.name for p in (ROOT / "cases").glob("test_*.py")
                if "# ci: a5" not in p.read_text().splitlines()]
    assert unmarked == []


def test_goldens_never_import_the_kernels_or_the_harness():
    bad = [p.name for p in (ROOT / "goldens").rglob("*.py")
           if any(line.startswith(("import v41", "from v41", "import harness", "from harness"))
                  for line in (raw.strip() for raw in p.read_text().splitlines()))]
    assert bad == []
