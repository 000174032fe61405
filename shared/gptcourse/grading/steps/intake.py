"""A submission is data until proven a plain notebook: the step that admits a student's folder before anything
copies or opens it.

A submitted folder is made by the student (the exchange's inbound is theirs to write; an LMS archive is theirs to
build), so its names, its links and its files are hostile. `inspect` walks it without following any link and
accepts only regular files with an allowed name and extension, within size limits, whose every path component
is a real folder inside it; anything else (a symbolic link, a FIFO, a socket, a device, a hard link to a file
outside, a name with `..`, control characters or a leading dot) is refused with one report line each, and the
rest of the submission is graded. The lab's notebook itself must be such a file: a notebook that is a link to
another student's or to solutions/LAB/LAB.ipynb is refused, and the lab is graded as not submitted.

Where it runs (every path by which a submission enters the course or is read):
- `nbgrader collect` (the exchange, also the Hub's): `IntakeCollect` copies only what `inspect` accepts, each
  file opened with O_NOFOLLOW and checked to be the file inspected; a student id that is not allowed is not
  collected;
- `nbgrader zip_collect`: `IntakeFileNameCollector` refuses ids and non-regular files (the archives' bounds are
  `zip_intake.BoundedExtractor`'s);
- `nbgrader autograde` (and so `gptcourse autograde`, one machine or `--cluster`, whose workers run nbgrader's
  Autograde with the course's config): `AdmittingExporter` refuses a folder whose student id is not allowed before
  nbgrader makes its gradebook row; `admit_submitted`, from the pre-convert hook, before nbgrader copies
  anything, moves what it refuses out of grading/submitted/STUDENT/LAB into grading/refused/LAB/STUDENT/ (kept,
  never followed); `ReportRefused` puts the lines in the grading report;
- `gptcourse similarity` reads notebooks with `read_regular`.
Lines of a refusal are kept in grading/refused/LAB/STUDENT.txt, so a submission graded again reports them again
(`report_no_notebook`, which also reports a submitted folder that holds no notebook at all: nbgrader skips it).

Student ids are an allowlist (`STUDENT_ID`), the same for the Hub's accounts: checked where an id enters
(exchange folder names, archive member names, grading/submitted/ folder names), never renamed.
"""

from __future__ import annotations

import datetime
import logging
import os
import pwd
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.exchange.abc.exchange import ExchangeError
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.plugins.zipcollect import FileNameCollectorPlugin
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import parse_utc

from .report import WriteGradingReport, add_line
from .sanitize import TolerantNotebookExporter

STUDENT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # also the Hub's student accounts (hub.py)
EXTENSIONS = frozenset({".ipynb", ".py", ".txt", ".md", ".csv", ".json", ".png", ".jpg", ".jpeg", ".gif", ".svg",
                        ".pdf"})
LOG = logging.getLogger(__name__)
TIMESTAMP_FILE = "timestamp.txt"  # written by nbgrader submit, read by collect and autograde
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?( [A-Z]{1,5}| [+-]\d{4})?")
REFUSED = os.path.join("grading", "refused")  # relative to the course root: <lab>/<student>/ and <student>.txt
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


@dataclass(frozen=True)
class Limits:
    """How much of a submission is admitted."""

    file_bytes: int = 50_000_000  # each file
    total_bytes: int = 100_000_000  # all files together
    files: int = 200
    depth: int = 4  # folders inside the submission


LIMITS = Limits()


def shown(text: str, width: int = 80) -> str:
    """A student-controlled name as a report line or a terminal shows it: control characters escaped, cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[:width - 1] + "…"


def student_id_problem(student: str) -> str | None:
    """Why `student` may not be a student id, or None if it may."""
    if STUDENT_ID.fullmatch(student):
        return None
    return (f"the student id '{shown(student)}' is not allowed (expected 1 to 64 lowercase letters, digits or '-', "
            "starting with a letter or digit)")


def name_problem(name: str) -> str | None:
    """Why a file or folder name in a submission is refused, or None."""
    if name.startswith("."):
        return "its name starts with a dot"
    if ".." in name:
        return "its name holds '..'"
    if not name.isprintable():
        return "its name holds control characters"
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        return "its name is longer than 255 bytes"
    return None


@dataclass(frozen=True)
class Refusal:
    path: str  # relative to the submission folder
    reason: str

    def line(self) -> str:
        return f"not graded: {shown(self.path)} ({self.reason})"


@dataclass(frozen=True)
class Accepted:
    path: str  # relative to the submission folder
    device: int
    inode: int
    size: int


@dataclass
class Inspection:
    accepted: list[Accepted] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # relative, parents first


def _open_folder(name: str | Path, dir_fd: int | None = None) -> int:
    return os.open(name, _NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _timestamp_problem(name: str, dir_fd: int) -> str | None:
    """Why the submission's timestamp.txt (which nbgrader parses at collect and at autograde, and which a
    student writes) is not a time as `nbgrader submit` writes it; None if it is one."""
    fd = os.open(name, _NOFOLLOW, dir_fd=dir_fd)
    try:
        text = os.read(fd, 200).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if TIMESTAMP.fullmatch(text):
        try:
            parse_utc(text)
            return None
        except (ValueError, OverflowError):
            pass
    return "not a time as nbgrader submit writes it (like 2026-12-03 19:41:00.123456 UTC)"


def owner_problem(path: str | Path, student: str) -> str | None:
    """Why an inbound folder claiming to be `student`'s is not theirs: where `student` has an account on this
    machine (a Hub, a shared exchange), the folder must be owned by it, or another student could hand work in
    under that name and replace theirs; None otherwise (nbgrader's own check only warns)."""
    try:
        account = pwd.getpwnam(student).pw_uid
    except KeyError:
        return None  # no such account: the exchange is not one with an account per student
    owner = os.lstat(path).st_uid
    if owner == account:
        return None
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = f"uid {owner}"
    return f"it claims to be {student}'s but is owned by {shown(name)}"


def inspect(folder: Path, limits: Limits = LIMITS) -> Inspection:
    """What of `folder` is admitted and what is refused, walked without following links (OSError if `folder`
    itself is a link or not a folder: ELOOP/ENOTDIR)."""
    result = Inspection()
    links: dict[tuple[int, int], int] = {}  # (device, inode) -> names inside the folder
    total = 0

    def walk(fd: int, prefix: str, depth: int) -> None:
        nonlocal total
        with os.scandir(fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            path = prefix + name
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            problem = name_problem(name)
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError:
                    target = "?"
                result.refused.append(Refusal(path, f"a symbolic link, to '{shown(target, 200)}'; links are never "
                                                    "followed"))
            elif problem is not None:
                result.refused.append(Refusal(path, problem))
            elif stat.S_ISDIR(st.st_mode):
                if depth >= limits.depth:
                    result.refused.append(Refusal(path, f"a folder deeper than {limits.depth} levels"))
                    continue
                result.folders.append(path)
                child = _open_folder(name, fd)
                try:
                    walk(child, path + "/", depth + 1)
                finally:
                    os.close(child)
            elif not stat.S_ISREG(st.st_mode):
                result.refused.append(Refusal(path, f"{_kind(st.st_mode)}, not a file"))
            elif os.path.splitext(name)[1].lower() not in EXTENSIONS:
                result.refused.append(Refusal(path, "not an allowed kind of file (allowed: "
                                                    f"{', '.join(sorted(EXTENSIONS))})"))
            elif st.st_size > limits.file_bytes:
                result.refused.append(Refusal(path, f"larger than {limits.file_bytes // 1_000_000} MB"))
            elif total + st.st_size > limits.total_bytes:
                result.refused.append(Refusal(path, f"the submission's files pass {limits.total_bytes // 1_000_000}"
                                                    " MB in all"))
            elif len(result.accepted) >= limits.files:
                result.refused.append(Refusal(path, f"more than {limits.files} files"))
            elif path == TIMESTAMP_FILE and (problem := _timestamp_problem(name, fd)) is not None:
                result.refused.append(Refusal(path, problem))
            else:
                total += st.st_size
                result.accepted.append(Accepted(path, st.st_dev, st.st_ino, st.st_size))
                if st.st_nlink > 1:
                    links[(st.st_dev, st.st_ino)] = links.get((st.st_dev, st.st_ino), 0) + 1

    fd = _open_folder(folder)
    try:
        walk(fd, "", 0)
    finally:
        os.close(fd)
    if links:  # a hard link whose other names are not all in the folder: its content is another file's
        outside = {key for key, inside in links.items()
                   if os.stat(folder / next(a.path for a in result.accepted if (a.device, a.inode) == key),
                              follow_symlinks=False).st_nlink > inside}
        for entry in [a for a in result.accepted if (a.device, a.inode) in outside]:
            result.accepted.remove(entry)
            result.refused.append(Refusal(entry.path, "a hard link to a file outside the submission"))
    return result


def _open_regular(path: Path, expected: Accepted | None = None) -> int:
    """An fd of the regular file at `path`, opened without following a link in its last component (and, if
    `expected`, the very file inspected); OSError otherwise."""
    fd = os.open(path, _NOFOLLOW)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (expected is not None and (st.st_dev, st.st_ino) != (expected.device,
                                                                                             expected.inode)):
        os.close(fd)
        raise OSError(f"{path} changed or is not a regular file")
    return fd


def _read_fd(fd: int, limit: int) -> Iterator[bytes]:
    """The bytes of `fd`, in chunks; OSError past `limit` bytes (the file grew since it was inspected)."""
    read = 0
    while chunk := os.read(fd, 1 << 20):
        read += len(chunk)
        if read > limit:
            raise OSError(f"more than {limit} bytes")
        yield chunk


def read_regular(path: Path, limit: int = LIMITS.file_bytes) -> bytes:
    """The bytes of a regular file, never through a link or from a device; OSError otherwise or past `limit`."""
    fd = _open_regular(path)
    try:
        return b"".join(_read_fd(fd, limit))
    finally:
        os.close(fd)


def is_regular(path: Path) -> bool:
    """`path` is a regular file itself, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def copy_submission(source: Path, dest: Path, limits: Limits = LIMITS) -> list[str]:
    """Copy the admitted files of `source` into `dest` (made here; it must not exist), each opened with
    O_NOFOLLOW, checked to be the file inspected and written rw-r--r-- (no execute or setuid bit); return the
    report lines of what was refused."""
    found = inspect(source, limits)
    dest.mkdir(parents=True)
    for folder in found.folders:
        (dest / folder).mkdir()
    lines = [refusal.line() for refusal in found.refused]
    for entry in found.accepted:
        try:
            fd = _open_regular(source / entry.path, entry)
        except OSError as error:
            lines.append(Refusal(entry.path, f"it changed while it was collected ({error.strerror or error})").line())
            continue
        try:
            out = os.open(dest / entry.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                for chunk in _read_fd(fd, entry.size):
                    os.write(out, chunk)
            finally:
                os.close(out)
        except OSError:
            (dest / entry.path).unlink(missing_ok=True)
            lines.append(Refusal(entry.path, "it changed while it was collected").line())
        finally:
            os.close(fd)
    return lines


# ---------------------------------------------------------------------------------------------------------------
# The record of refusals: grading/refused/<lab>/<student>.txt (lines) and <student>/ (what was moved out).


def record_path(root: str | Path, lab: str, student: str) -> Path:
    return Path(root, REFUSED, lab, f"{student}.txt")


def write_record(root: str | Path, lab: str, student: str, lines: list[str], append: bool = False) -> None:
    """Keep a submission's refusal lines (a new collection replaces them: `append` False)."""
    path = record_path(root, lab, student)
    if not lines and not append:
        path.unlink(missing_ok=True)
        return
    if lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a" if append else "w", encoding="utf-8") as record:
            record.write("".join(f"{line}\n" for line in lines))


def read_record(root: str | Path, lab: str, student: str) -> list[str]:
    try:
        return record_path(root, lab, student).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


class IntakeError(SystemExit):
    """A submitted folder could not be inspected: autograde stops rather than copy what it has not seen."""


def admit_submitted(root: str | Path, folder: Path, limits: Limits = LIMITS) -> list[str]:
    """Admit grading/submitted/STUDENT/LAB in place, before nbgrader copies anything from it: what `inspect`
    refuses is moved (renamed, so a link stays a link) to grading/refused/LAB/STUDENT/, and its lines are added to
    the record; return the lines added. A folder whose student id is not allowed, or that is a link, is moved out
    whole."""
    lab, student = folder.name, folder.parent.name
    problem = student_id_problem(student)
    if problem is None and folder.is_symlink():
        problem = f"the submitted folder of {student} is a symbolic link"
    if problem is not None:  # no path is made from this id: the folder goes under a name of ours
        quarantine = Path(root, REFUSED, lab, "not-graded")
        quarantine.mkdir(parents=True, exist_ok=True)
        os.rename(folder, quarantine / f"{len(os.listdir(quarantine))}")
        return [f"{problem}: {shown(str(folder))} was not graded (moved to {quarantine})"]
    try:
        found = inspect(folder, limits)
    except OSError as error:
        raise IntakeError(f"autograde stopped: {shown(str(folder))} could not be inspected ({error}); nothing of "
                          "it was copied") from None
    if not found.refused:
        return []
    quarantine = Path(root, REFUSED, lab, student)
    for refusal in found.refused:
        _move_out(folder / refusal.path, quarantine / refusal.path)
    lines = [refusal.line() for refusal in found.refused]
    write_record(root, lab, student, lines, append=True)
    return lines


def _move_out(path: Path, target: Path) -> None:
    """Move `path` (a link stays a link) to `target` (a free name beside it if taken); where it cannot be moved
    (another filesystem), remove it: it must not stay where nbgrader copies from."""
    target.parent.mkdir(parents=True, exist_ok=True)
    free, n = target, 0
    while os.path.lexists(free):
        n += 1
        free = target.with_name(f"{target.name}~{n}")
    try:
        os.rename(path, free)
    except OSError:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)  # never follows a link
        else:
            os.unlink(path)


def admit_for_autograde(root: str | Path, notebooks: list[str]) -> None:
    """nbgrader's pre-convert hook, first part: admit the submission whose notebooks nbgrader listed (`notebooks`,
    changed in place: emptied if the student id is not allowed, so nbgrader converts nothing of it). nbgrader
    ignores a hook's exceptions, so any failure here stops autograde (IntakeError) rather than let it copy."""
    for folder in sorted({Path(path).parent for path in notebooks}):
        try:
            lines = admit_submitted(root, folder)
        except IntakeError:
            raise
        except Exception as error:
            raise IntakeError(f"autograde stopped: {shown(str(folder))} could not be admitted ({error})") from None
        for line in lines:
            LOG.warning("%s/%s: %s", shown(folder.parent.name), folder.name, line)
        if not os.path.lexists(folder):  # moved out whole
            notebooks.clear()


class AdmittingExporter(TolerantNotebookExporter):
    """Autograde's exporter (nbgrader_config.py), which also refuses the listed submissions whose student id is not
    allowed or whose folder is a link. nbgrader's Autograde lists grading/submitted/*/LAB, then makes this exporter,
    then, for each submission, runs the pre-convert hook and makes the student's gradebook row: this is the one
    step of the course between listing and that row (docs/upstream.md, 4). Each such folder is moved out whole
    (`admit_submitted`), an error line names it, and the rest of the class is graded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        converter = self.parent
        listed = getattr(converter, "assignments", None)  # nbgrader's {submitted folder: its notebooks}
        if not isinstance(listed, dict) or not hasattr(converter, "coursedir"):
            return
        for folder in sorted(listed):
            path = Path(folder)
            if student_id_problem(path.parent.name) is not None or path.is_symlink():
                del listed[folder]
                for line in admit_submitted(converter.coursedir.root, path):
                    converter.log.error("not graded: %s", line)


class ReportRefused(NbGraderPreprocessor):
    """Put the submission's refusal lines (grading/refused/LAB/STUDENT.txt) in its grading report."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        info = resources["nbgrader"]
        for line in read_record(".", info["assignment"], info["student"]):  # nbgrader runs in the course root
            add_line(nb, line)
        return nb, resources


# ---------------------------------------------------------------------------------------------------------------
# nbgrader's collect steps, owned here (named in nbgrader_config.py).


class IntakeCollect(ExchangeCollect):
    """`nbgrader collect` that collects only allowed student ids, and only what `inspect` admits of each."""

    def _path_to_record(self, path: str) -> dict:
        """nbgrader's record of an inbound folder (STUDENT+LAB+TIMESTAMP[+RANDOM]); one whose name does not parse
        is kept as a student of its own that `init_src` refuses, instead of stopping the whole collection."""
        name = os.path.basename(path)
        try:
            record = super()._path_to_record(path)
        except (ExchangeError, ValueError, OverflowError):
            record, problem = None, "its name is not STUDENT+LAB+TIMESTAMP (nbgrader submit's)"
        else:
            problem = (student_id_problem(record["username"])
                       or (owner_problem(path, record["username"]) if self.check_owner else None))
        if problem is None:
            return record
        # a group of its own, so that it never stands for (or in front of) the student it names
        return {"username": "\0" + name, "filename": name, "problem": problem,
                "timestamp": datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)}

    def init_src(self) -> None:
        super().init_src()
        kept = []
        for record in self.src_records:
            problem = record.get("problem")
            if problem is None:
                kept.append(record)
            else:
                self.log.error("not collected: %s, in the exchange's %s", problem, shown(record["filename"]))
        self.src_records = kept

    def do_copy(self, src: str, dest: str, log: Any = None) -> None:
        student, lab = Path(dest).parent.name, Path(dest).name
        try:
            lines = copy_submission(Path(src), Path(dest))
        except OSError as error:  # the inbound folder is a link, or not a folder
            lines = [f"the submission in the exchange ({shown(Path(src).name)}) is not a folder that can be read "
                     f"without following a link ({error.strerror or error}): nothing was collected"]
        write_record(self.coursedir.root, lab, student, lines)
        for line in lines:
            self.log.warning("%s/%s: %s", student, lab, line)


class IntakeFileNameCollector(FileNameCollectorPlugin):
    """zip_collect's file-name collector that refuses a file that is not a regular one, and a student id that
    is not allowed, before nbgrader makes any path from it."""

    def collect(self, submitted_file: str) -> dict | None:
        info = super().collect(submitted_file)
        if info is None:
            return None
        if not is_regular(Path(submitted_file)):
            self.log.error("not collected: %s is not a regular file", shown(submitted_file))
            return None
        student = info.get("student_id")
        problem = student_id_problem(student) if isinstance(student, str) else "no student id"
        if problem is not None:
            self.log.error("not collected: %s, from the file %s", problem, shown(submitted_file))
            return None
        file_id = info.get("file_id")
        if not isinstance(file_id, str) or any(name_problem(part) for part in file_id.split("/")):
            self.log.error("not collected: %s names a file that is not allowed", shown(submitted_file))
            return None
        return info


def report_no_notebook(root: str | Path, folder: Path, student: str, lab: str, path: Path) -> str:
    """Write the report of a submitted folder that holds no notebook; return its last line.

    Where the intake refused what was submitted (a notebook that is a link, moved out on an earlier run), the report
    gives its refusal lines (grading/refused/LAB/STUDENT.txt), as the first run's did. nbgrader does not see such
    a folder: no gradebook row, or the 0 of the run that refused it; `nbgrader export` counts both as 0."""
    refused = read_record(root, lab, student)
    if refused:
        line = "no notebook is left to grade: what was submitted was refused (the lines above); it scores 0 points"
    else:
        held = sorted(p.name for p in folder.iterdir())
        line = (f"no notebook was submitted (the folder holds {', '.join(held[:5]) or 'nothing'}): nothing to "
                "grade; nbgrader records no submission, which exports as 0 points")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{student} {lab}: no submission\n" + "".join(f"- {each}\n" for each in [*refused, line]))
    return line


def report_folders_without_notebook(root: str | Path, notebooks: list[str], reports: WriteGradingReport) -> None:
    """nbgrader's pre-convert hook, second part: the submitted folders of the lab (siblings of this submission's,
    <submitted>/<student>/<lab>) that hold no notebook get their report, since nbgrader never converts them; a
    folder whose student id is not allowed gets none (no path is made from it)."""
    for folder in sorted({Path(path).parent for path in notebooks}):
        lab = folder.name
        for sibling in sorted(folder.parent.parent.glob(f"*/{lab}")):
            student = sibling.parent.name
            if student_id_problem(student) is None and sibling.is_dir() and not any(sibling.glob("*.ipynb")):
                report_no_notebook(root, sibling, student, lab, reports.report_path(student, lab, lab))
