"""What a test needs to run something as another Unix account (an instructor, a student, `nobody`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def readable_by_all(path: Path) -> bool:
    """Every folder above `path` may be traversed by any account (no home folder such as /root's on the way)."""
    return all(parent.stat().st_mode & 0o001 for parent in [path, *path.parents])


def class_interpreter(folder: Path) -> str:
    """The test's own interpreter, where every account can run it; else a copy of its installation (the standard
    library, not its site-packages) under `folder`, its library path made relative ($ORIGIN) so that it loads its
    own libpython and not the root-only original's."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if readable_by_all(base / "bin"):
        return str(base / "bin" / version)
    copy = folder / "python"
    shutil.copytree(base, copy, symlinks=True, ignore=lambda where, names: {"site-packages", "test"} & set(names))
    binary = copy / "bin" / version
    old = str(base / "lib").encode() + b"\0"
    data = binary.read_bytes()
    if old in data:  # RUNPATH: a shorter string fits in place, padded with NULs
        binary.write_bytes(data.replace(old, b"$ORIGIN/../lib".ljust(len(old), b"\0")))
    return str(binary)
