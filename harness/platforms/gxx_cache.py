"""A compile cache for the host control-flow code pypto 0.2.0 builds at every launch.

pypto 0.2.0 compiles a jit kernel again at every call in SIM mode
(``JitCallableWrapper._execute_kernel`` calls ``compile`` each time), and every compile
writes the kernel's host control flow and expression tables as C++ and runs
``g++ -O2 -S`` on each file (about 0.25 s a file, three to ten files a kernel, some of them
one after another): most of a TINY launch's wall time beside pypto's own passes.  Every
rank and epoch of a case, and every test that launches the same kernel at the same case,
writes the same sources.

:func:`install` puts a ``g++`` first on this process's ``PATH`` (pypto runs ``sh -c
"LD_PRELOAD= g++ ..."``).  It keys each ``-S`` compile of one ``.cpp`` on the SHA-256 of
the real compiler's path and mtime, the flags, the source's file name (the assembly's
``.file`` line) and the preprocessed text (``g++ -E -P``, so the included headers count),
and on a hit copies the stored assembly instead of compiling: the same bytes the compiler
wrote for that input.  Every other call (``-c`` of the assembly, links) goes to the real
compiler.  A failed compile stores nothing.  ``V41_GXX_CACHE=0`` turns the cache off.  The
store is ``<cache root>/gxx/store`` (a few KB an entry; delete it at will).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ENV_GXX_CACHE = "V41_GXX_CACHE"
VERSION = "1"  # part of every key: a new wrapper never reads an older one's entries

_WRAPPER = """#!/bin/sh
# v41 harness g++ cache (harness/platforms/gxx_cache.py), version {version}
REAL={real}
STORE={store}
case " $* " in *" -S "*) ;; *) exec "$REAL" "$@";; esac
src=; out=; prev=; n=0
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  case $a in *.cpp) src=$a; n=$((n + 1));; esac
  prev=$a
done
{{ [ "$n" = 1 ] && [ -n "$out" ]; }} || exec "$REAL" "$@"
flags=; skip=0
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case $a in -o) skip=1; continue;; -S) continue;; esac
  [ "$a" = "$src" ] && continue
  flags="$flags $a"
done
pre=$(mktemp) || exec "$REAL" "$@"
if ! "$REAL" $flags -E -P "$src" -o "$pre" 2>/dev/null; then rm -f "$pre"; exec "$REAL" "$@"; fi
key=$({{ echo "{version} $REAL $(stat -c %Y "$REAL") $flags $(basename "$src")"; cat "$pre"; }} \\
      | sha256sum | cut -c1-64)
rm -f "$pre"
if [ -f "$STORE/$key.s" ] && cp "$STORE/$key.s" "$out"; then exit 0; fi
"$REAL" "$@" || exit $?
cp "$out" "$STORE/$key.s.$$" && mv -f "$STORE/$key.s.$$" "$STORE/$key.s"
exit 0
"""


def enabled() -> bool:
    return os.environ.get(ENV_GXX_CACHE, "1") not in ("0", "false", "False", "")


def install(root: Path) -> Path | None:
    """Write the ``g++`` wrapper under ``root / "bin"`` (store ``root / "store"``) and put
    that directory first on ``os.environ["PATH"]``; returns it, or None when the cache is
    off or no ``g++`` is on the PATH (pypto then fails or runs as it would anyway)."""
    if not enabled():
        return None
    bin_dir, store = Path(root) / "bin", Path(root) / "store"
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != bin_dir]
    real = shutil.which("g++", path=os.pathsep.join(path))
    if real is None:
        return None
    bin_dir.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    text = _WRAPPER.format(version=VERSION, real=_sh_quote(real), store=_sh_quote(str(store)))
    wrapper = bin_dir / "g++"
    if not wrapper.exists() or wrapper.read_text() != text:
        fd, tmp = tempfile.mkstemp(prefix=".g++-", dir=bin_dir)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, wrapper)
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), *path])
    return bin_dir


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
