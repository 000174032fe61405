"""`nbgrader zip_collect`'s extraction, bounded: an archive downloaded from an LMS is the students' to build.

`BoundedExtractor` (ZipCollectApp.extractor_plugin) extracts each .zip or .tar[.gz] archive of the downloaded
folder into a folder of its own, as nbgrader's does, but every member is checked before anything is written: a
regular file or a folder (no link, device or FIFO), a relative name whose every part is an allowed name
(`intake.name_problem`: no `..`, no leading dot, no control characters; so nothing lands outside the archive's
folder), and the archive within bounds: members, bytes per member and in all (counted as they are written, not
as the archive declares them), compression ratio and time. Extracted files are written rw-r--r--: no execute or
setuid bit survives. A refused member refuses its archive (one error line naming it and why; nothing of it is
kept) and the other archives are still extracted. Archives inside an archive are extracted too, within the same
bounds. A downloaded file that is not an archive is copied if it is a regular file.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nbgrader.plugins.zipcollect import ExtractorPlugin
from traitlets import Float, Int

from ..steps.intake import is_regular, name_problem, read_regular, shown


class ArchiveRefused(Exception):
    """Why an archive is not extracted."""


@dataclass(frozen=True)
class Member:
    name: str
    is_dir: bool
    size: int  # as the archive declares it
    packed: int  # compressed size (zip), or the declared size (tar)
    opener: Any  # () -> a readable stream


@dataclass
class Budget:
    """What is left of one downloaded archive's bounds (shared with the archives inside it)."""

    members: int
    total_bytes: int
    deadline: float


def _zip_members(archive: zipfile.ZipFile) -> Iterator[Member]:
    for info in archive.infolist():
        mode = info.external_attr >> 16
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ArchiveRefused(f"member {shown(info.filename)} is not a file or a folder (a link, a device or a "
                                 "FIFO)")
        yield Member(info.filename, info.is_dir(), info.file_size, info.compress_size,
                     lambda info=info: archive.open(info))


def _tar_members(archive: tarfile.TarFile) -> Iterator[Member]:
    for info in archive.getmembers():
        if not (info.isfile() or info.isdir()):
            raise ArchiveRefused(f"member {shown(info.name)} is not a file or a folder (a link, a device or a FIFO)")
        yield Member(info.name, info.isdir(), info.size, info.size, lambda info=info: archive.extractfile(info))


@contextmanager
def _members(path: Path) -> Iterator[list[Member]]:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            yield list(_zip_members(archive))
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            yield list(_tar_members(archive))
    else:
        raise ArchiveRefused("not a zip or tar archive")


def is_archive(name: str) -> bool:
    return name.lower().endswith((".zip", ".tar", ".tar.gz", ".tgz"))


def archive_stem(name: str) -> str:
    for suffix in (".tar.gz", ".tgz", ".zip", ".tar"):
        if name.lower().endswith(suffix):
            return name[:-len(suffix)]
    return name


class BoundedExtractor(ExtractorPlugin):
    """zip_collect's extractor, with bounds (see the module)."""

    max_members = Int(2000, help="Members of one downloaded archive, archives inside it included").tag(config=True)
    member_mb = Float(50, help="Largest member, extracted (MB)").tag(config=True)
    total_mb = Float(1000, help="All members of one downloaded archive, extracted (MB)").tag(config=True)
    max_ratio = Float(200, help="Largest extracted/compressed size of a member over 1 MB").tag(config=True)
    seconds = Float(120, help="Time to extract one downloaded archive (s)").tag(config=True)
    nesting = Int(2, help="Archives inside archives, levels").tag(config=True)

    def extract(self, archive_path: str, extracted_path: str) -> None:
        root, out = Path(archive_path), Path(extracted_path)
        for folder, _, names in os.walk(root):  # does not enter linked folders
            for name in sorted(names):
                path = Path(folder) / name
                dest = out / path.parent.relative_to(root)
                if not is_regular(path):
                    self.log.error("not extracted: %s is not a regular file", shown(str(path)))
                    continue
                dest.mkdir(parents=True, exist_ok=True)
                if is_archive(name):
                    self.extract_archive(path, dest / archive_stem(name))
                else:
                    _write(dest / name, [read_regular(path, int(self.member_mb * 1e6))])

    def extract_archive(self, path: Path, dest: Path) -> bool:
        """Extract `path` into `dest` (new), all of it or, if any member is refused, nothing (an error line)."""
        budget = Budget(self.max_members, int(self.total_mb * 1e6), time.monotonic() + self.seconds)
        try:
            dest.mkdir(parents=True)
            self._extract(path, dest, budget, 0)
            return True
        except (ArchiveRefused, OSError, zipfile.BadZipFile, tarfile.TarError, EOFError) as refused:
            shutil.rmtree(dest, ignore_errors=True)
            self.log.error("not extracted: the archive %s (%s); nothing of it is collected", shown(str(path), 200),
                           shown(str(refused), 200))
            return False

    def _extract(self, path: Path, dest: Path, budget: Budget, level: int) -> None:
        with _members(path) as members:
            budget.members -= len(members)
            if budget.members < 0:
                raise ArchiveRefused(f"more than {self.max_members} members")
            for member in members:
                self._check(member)
            nested = []
            for member in members:
                target = dest.joinpath(*_parts(member.name))
                if member.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with member.opener() as stream:
                    _write(target, self._chunks(stream, member, budget))
                if is_archive(target.name):
                    nested.append(target)
        for archive in nested:
            if level + 1 > self.nesting:
                raise ArchiveRefused(f"archives nested more than {self.nesting} levels deep")
            inner = archive.with_name(archive_stem(archive.name))
            inner.mkdir()
            self._extract(archive, inner, budget, level + 1)
            archive.unlink()

    def _check(self, member: Member) -> None:
        parts = _parts(member.name)
        if member.name.startswith(("/", "\\")) or not parts:
            raise ArchiveRefused(f"member {shown(member.name)} has an absolute or empty name")
        for part in parts:
            if problem := name_problem(part):
                raise ArchiveRefused(f"member {shown(member.name)}: {problem}")
        if member.size > self.member_mb * 1e6:
            raise ArchiveRefused(f"member {shown(member.name)} is larger than {self.member_mb:g} MB")
        if member.size > 1_000_000 and member.size > self.max_ratio * max(member.packed, 1):
            raise ArchiveRefused(f"member {shown(member.name)} expands {member.size / max(member.packed, 1):.0f} "
                                 f"times (more than {self.max_ratio:g})")

    def _chunks(self, stream: IO[bytes], member: Member, budget: Budget) -> Iterator[bytes]:
        written = 0
        while chunk := stream.read(1 << 20):
            written += len(chunk)
            budget.total_bytes -= len(chunk)
            if written > self.member_mb * 1e6 or written > max(member.size, 0):
                raise ArchiveRefused(f"member {shown(member.name)} holds more than it declares")
            if budget.total_bytes < 0:
                raise ArchiveRefused(f"it expands to more than {self.total_mb:g} MB")
            if time.monotonic() > budget.deadline:
                raise ArchiveRefused(f"extracting it took more than {self.seconds:g} s")
            yield chunk


def _parts(name: str) -> list[str]:
    return [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]


def _write(path: Path, chunks: Any) -> None:
    """A new file rw-r--r--, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        for chunk in chunks:
            os.write(fd, chunk)
    finally:
        os.close(fd)
