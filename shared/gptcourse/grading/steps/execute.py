"""Running a submission so that a crash or a hang costs only the questions it breaks.

`RobustExecute` replaces nbgrader's Execute preprocessor in `nbgrader autograde`:
- a kernel that dies in a cell (os._exit, a segfault, out of memory) is restarted; the code cells that ran before
  it (setup, solutions, the student's own cells; not the test cells) run again silently in the new kernel, and
  grading goes on after the cell that killed it, so tests recorded before it still count;
- a cell that times out is interrupted (nbgrader's behaviour); one that ignores the interrupt (SIGINT ignored, a
  C loop) has its kernel killed and restarted the same way;
- after `max_restarts` restarts the remaining cells are not run (their tests record nothing and fail);
- each cell's output is capped at `max_output_bytes` (a print loop cannot exhaust the grader's memory);
- every message a kernel sends about a cell is checked against the form the grader and nbformat read
  (`message_problem`: known message types, text where text belongs, a mimebundle where one belongs, an integer
  execution count): the student's kernel can send anything through its own session, and a forged message must cost
  its cell, never the submission. Such a message is dropped, its cell gets an error output (`FORGED`, so a test cell
  fails: `judge.py`) and the report a line;
- every kernel runs in the sandbox (`sandbox.py`): a bubblewrap box that sees only the interpreter, its
  libraries and the gptcourse package, as an unprivileged user, with limits; its working folder /scratch holds a
  copy of the submission's folder only, emptied afterwards, so files a notebook writes never reach the
  autograded folder, the feedback or other submissions. A grader process starts one box per lab and resets it
  between submissions (every process in it but its zygote killed, its folders emptied), so the zygote's import
  of torch is paid once, not per submission: `nbgrader autograde` keeps its box for the whole command (a box
  whose zygote died is replaced), `gptcourse autograde` hands each worker's box in (`with_box`). If the box
  cannot start, grading stops before anyone is graded (unless `c.Sandbox.allow_unsandboxed`, which runs kernels
  as before: as the grader's user, in a temporary folder);
- the kernel's environment holds only the variables `confine.KERNEL_VARIABLES` names (no token, password or
  course secret of the grader's), so a cell cannot print a credential into its feedback;
- a boxed kernel sees a view of the package without the lab's references (`package_view.py`), and gets the
  cases' inputs from the grader, as a file in its /scratch (`kernel_inputs.py`);
- a hidden test cell runs with each hidden case id replaced by an opaque handle, without its comments
  (`handles.py`: the notebook keeps the instructor's source, the judge maps the handles back), and the kernel's
  environment loses the hidden seeds once the inputs are written: what a kernel reads of itself (its history, a
  pre-run hook, a caller's frame, its environment) names no hidden case.
Every event is a line in the grading report: "kernel died in cell 7 ('test_attention')", "cell 9 (...) timed
out after 60 s", "kernel ran out of memory (limit 3 GB for the kernel and every process it starts) in cell 7
('test_attention'); tests before it still count" (a MemoryError, or the box's memory limit killed the kernel and
what it started: `Box.memory_limit_hit`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.preprocessors import Execute
from traitlets import Integer

from ...notebook_run import drop_widget_capture
from ..box.confine import kernel_variables
from ..box.sandbox import Box, Limits, Sandbox, course_folders, read_only_folders, require_sandbox
from ..box.zygote import ZygoteError
from ..cases import HIDDEN_SEEDS_ENV, kernel_environment
from ..handles import HANDLES, run_source
from ..kernel_inputs import FILE_NAME, INPUTS_ENV, write_inputs
from .judge import FORGED
from .report import add_line, cell_label

# A limit of the box, as a cell's error shows it: (limit, words in the error, what the report says was hit).
LIMIT_SIGNS = (
    ("memory", ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc"),
     "kernel ran out of memory"),
    ("processes", ("Resource temporarily unavailable", "can't start new thread"), "kernel hit the process limit"),
    ("file", ("File too large",), "a file grew past the file-size limit"),
    ("scratch", ("No space left on device",), "the kernel filled its scratch space"),
)


OUTPUT_TYPES = ("stream", "display_data", "execute_result", "error", "update_display_data")  # capped in size
_JSON_MIMETYPE = re.compile(r"application/(.*\+)?json")  # nbformat's: any JSON value; every other mimetype is text


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _lines(value: object) -> bool:
    return isinstance(value, list) and all(map(_is_str, value))


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def _count(value: object) -> bool:
    return value is None or type(value) is int


def _bundle(data: object) -> bool:
    """A mimebundle as nbformat stores one: mimetype -> text (a string or a list of lines), or JSON for JSON types."""
    return isinstance(data, dict) and all(
        isinstance(mimetype, str) and (_JSON_MIMETYPE.fullmatch(mimetype) or _is_str(value) or _lines(value))
        for mimetype, value in data.items())


def _comm_data(data: object) -> bool:
    """A widget message's data, as nbclient reads it (the graded notebook keeps no widget: `active_content.py`)."""
    if not isinstance(data, dict) or not isinstance(data.get("state", {}), dict):
        return False
    paths = data.get("buffer_paths", [])
    return isinstance(paths, list) and all(isinstance(p, list) and all(isinstance(k, str | int) for k in p)
                                           for p in paths)


# What the grader reads of each kind of message a kernel sends about a cell (nbclient; nbformat's output schema):
# {field: its test} of the fields that must be there. A message of any other kind is forged.
_DISPLAY = {"data": _bundle, "metadata": _is_dict}
MESSAGE_FIELDS: dict[str, dict[str, Callable[[object], bool]]] = {
    "status": {"execution_state": _is_str},
    "execute_input": {},
    "clear_output": {},
    "stream": {"name": lambda name: name in ("stdout", "stderr"), "text": _is_str},
    "display_data": _DISPLAY,
    "update_display_data": _DISPLAY,
    "execute_result": {**_DISPLAY, "execution_count": _count},
    "error": {"ename": _is_str, "evalue": _is_str, "traceback": _lines},
    "comm_open": {"comm_id": _is_str, "data": _comm_data},
    "comm_msg": {"comm_id": _is_str, "data": _comm_data},
    "comm_close": {"comm_id": _is_str},
}


def message_problem(msg: object) -> str | None:
    """What is wrong with a kernel's message about a cell, for the grader that reads it; None if nothing."""
    if not isinstance(msg, dict) or not isinstance(msg.get("content"), dict):
        return "a message without content"
    msg_type, content = msg.get("msg_type"), msg["content"]
    fields = MESSAGE_FIELDS.get(msg_type) if isinstance(msg_type, str) else None
    if fields is None or not isinstance(msg.get("header"), dict) or msg["header"].get("msg_type") != msg_type:
        return f"a message of unknown type {str(msg_type)[:40]!r}"
    for name, test in fields.items():
        if name not in content:
            return f"a '{msg_type}' message without its {name}"
        value = content[name]
        if not test(value):
            if name == "data" and isinstance(value, dict):  # name the mimetype whose value is not text
                name, value = next((f"{m!s:.60}", v) for m, v in value.items() if not _bundle({m: v}))
            return f"a '{msg_type}' message whose {name} is {type(value).__name__}, which nbformat does not allow"
    transient = content.get("transient")
    display_id = transient.get("display_id") if isinstance(transient, dict) else None
    if not (transient is None or isinstance(transient, dict)) or not (display_id is None or _is_str(display_id)):
        return f"a '{msg_type}' message with a malformed display id"
    if not _count(content.get("execution_count")):
        return f"a '{msg_type}' message whose execution_count is {type(content['execution_count']).__name__}"
    return None


_PROCESS_BOX: dict[str, Box] = {}  # this process's box, under what it is (`process_box`): one at a time


def process_box(config: object, hidden: list[str], lab: str) -> Box:
    """This grader process's box for `lab`: the submissions of a lab all see the same folders, so one box serves
    them in turn, reset between them (`RobustExecute._clean_box`); a box for another lab, another view or other
    limits replaces it (nbgrader grades a lab's submissions one after another); closed at exit."""
    sandbox = Sandbox(config=config)
    key = json.dumps([read_only_folders(hidden), lab, sandbox.trait_values(config=True)], sort_keys=True,
                     default=str)
    box = _PROCESS_BOX.get(key)
    if box is None or not box.alive():
        close_process_box()
        box = _PROCESS_BOX[key] = sandbox.start_box(hidden, lab=lab)
    return box


def close_process_box() -> None:
    while _PROCESS_BOX:
        _PROCESS_BOX.popitem()[1].close()


atexit.register(close_process_box)


class RobustExecute(Execute):
    """nbgrader's Execute, surviving dead and hung kernels, with capped output and a scratch working folder."""

    max_restarts = Integer(3, help="Kernel restarts per notebook before the remaining cells are skipped").tag(
        config=True)
    max_output_bytes = Integer(2_000_000, help="Output kept per cell; the rest is dropped with a note").tag(
        config=True)
    box: Box | None = None  # set by `with_box`: a worker's box, reset between submissions

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict,
                   km: object = None) -> tuple[NotebookNode, ResourcesDict]:
        from nbclient import NotebookClient

        NotebookClient.__init__(self, nb, km)
        drop_widget_capture(self)  # a student's interact() must not hang the grader (`notebook_run.py`)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self.shutdown_kernel = "immediate"
        self._dropped: dict[int, int] = {}
        self._kept: dict[int, int] = {}
        self._forged: dict[int, list[str]] = {}
        folder = (resources or {}).get("metadata", {}).get("path") or "."
        info = resources["nbgrader"]
        lab = info["assignment"]
        env = kernel_environment(lab, info.get("student"))
        self._handles: dict[str, str] = {}  # hidden cases under opaque handles (`handles.py`): handle -> case id
        self._run_sources = {i: run for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
                             and utils.is_grade(cell) and (run := run_source(cell.source, self._handles)) is not None}
        resources[HANDLES] = self._handles  # for the judge
        self._box = self.box
        hidden = course_folders(self.config, folder)
        if self._box is None and require_sandbox(self.config, forbidden=hidden):
            self._box = process_box(self.config, hidden, lab)
        self._limits = self._box.limits if self._box else None
        try:
            if self._box is not None:
                self._clean_box()
                self._box.fill_scratch(folder)
                self._hand_inputs(self._box.host_scratch, lab, env)
                env[INPUTS_ENV] = f"{self._box.scratch}/{FILE_NAME}"  # the same file, as the box sees it
                self._run_in(nb, self._box.scratch, env, self._box.scratch_names)
            else:
                self._run_unsandboxed(nb, folder, env, lab)
        finally:
            if self._box is not None and self._box.alive():
                with contextlib.suppress(ZygoteError):  # the next submission's reset stops it if it must
                    self._box.reset()
        self.set_widgets_metadata()
        return self.nb, self.resources

    def _hand_inputs(self, scratch: str, lab: str, env: dict[str, str]) -> str:
        """Write the lab's case inputs, with the kernel's seeds, into the kernel's scratch folder `scratch` (a boxed
        kernel cannot make them: `kernel_inputs.py`; hidden cases only under their handles), and drop the seeds from
        `env`: a kernel that has the inputs needs none, and would match them to the cases' names. The file's path."""
        host = os.path.join(scratch, FILE_NAME)
        write_inputs(host, lab, env, self._handles)
        env.pop(HIDDEN_SEEDS_ENV, None)
        if self._box is not None and self._box.ids is not None:
            os.chown(host, *self._box.ids)
        return host

    def _clean_box(self) -> None:
        """Reset the box before a submission; a box that cannot be reset is closed (its worker starts another)
        and this submission is not graded."""
        try:
            self._box.reset()
        except ZygoteError:
            self._box.close()
            raise

    def _run_unsandboxed(self, nb: NotebookNode, folder: str, env: dict[str, str], lab: str) -> None:
        """The opt-out: a kernel as the grader's user, in a temporary folder, with the allowed variables and the
        grader's PATH and HOME (it could read the grader's environment from /proc anyway)."""
        env = kernel_variables(env) | {name: env[name] for name in ("PATH", "HOME") if name in env}
        scratch = tempfile.mkdtemp(prefix="gptcourse-grading-")
        try:
            shutil.copytree(folder, scratch, dirs_exist_ok=True, symlinks=True,
                            ignore=shutil.ignore_patterns("*.ipynb"))
            env[INPUTS_ENV] = self._hand_inputs(scratch, lab, env)
            self._run_in(nb, scratch, env, lambda: set(os.listdir(scratch)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _run_in(self, nb: NotebookNode, cwd: str, env: dict[str, str], names: Callable[[], set[str]]) -> None:
        """Run the notebook with the kernel in `cwd`; report the files it left there (`names()` lists them)."""
        before = names()
        self._run_all(nb, cwd, env)
        written = sorted(names() - before)
        if written:
            add_line(nb, f"the notebook wrote files while it ran ({', '.join(written[:5])}"
                         f"{', ...' if len(written) > 5 else ''}); they were discarded")

    def create_kernel_manager(self) -> object:
        """In a box: kernels forked by its zygote, connected over the ipc transport."""
        if self._box is not None and not getattr(self.kernel_manager_class, "_gptcourse_box", False):
            from ..box.zygote import zygote_kernel_manager

            self.kernel_manager_class = zygote_kernel_manager(self.kernel_manager_class, self._box.client,
                                                              ipc_dir=self._box.ipc_dir, owner=self._box.ids)
            self.kernel_manager_class._gptcourse_box = True
        return super().create_kernel_manager()

    def _run_all(self, nb: NotebookNode, scratch: str, env: dict[str, str]) -> None:
        index, restarts, broken = 0, 0, set()
        while index < len(nb.cells):
            with self.setup_kernel(cwd=scratch, env=env):
                info = self.wait_for_reply(self.kc.kernel_info())
                self.nb.metadata["language_info"] = info["content"]["language_info"]
                if restarts and not self._replay(nb, index, broken):
                    add_line(nb, "the kernel failed again while re-running the earlier cells: the remaining cells "
                                 "were not run")
                    self._skip(nb, index)
                    return
                while index < len(nb.cells) and not self._run_cell(nb, index):
                    index += 1
            if index == len(nb.cells):
                return
            broken.add(index)
            index += 1
            restarts += 1
            if index < len(nb.cells) and restarts > self.max_restarts:
                add_line(nb, f"the kernel was restarted {self.max_restarts} times: the remaining cells were not run")
                self._skip(nb, index)
                return

    def _run_cell(self, nb: NotebookNode, index: int) -> bool:
        """Run cell `index`; True if it broke the kernel (dead, or hung past the interrupt)."""
        cell = nb.cells[index]
        self._kept[index] = 0
        source = cell.source
        try:
            cell.source = self._run_sources.get(index, source)  # hidden checks under their handles
            self.preprocess_cell(cell, self.resources, index)
        except DeadKernelError:
            if self._box is not None and self._box.memory_limit_hit():
                self._fail(nb, cell, "MemoryLimit", f"the kernel and the processes it started used more than "
                           f"{self._limits.describe('memory')}: they were stopped",
                           f"{limit_line('memory', self._limits)} in {cell_label(cell, index)}; tests before it "
                           f"still count")
            else:
                self._fail(nb, cell, "KernelDied", "the kernel died while running this cell",
                           f"kernel died in {cell_label(cell, index)}")
            return True
        except CellTimeoutError:
            self._fail(nb, cell, "CellTimeoutError", f"this cell ran longer than {self.timeout} s and ignored the "
                       "interrupt", f"{cell_label(cell, index)} timed out after {self.timeout} s and ignored the "
                       "interrupt: the kernel was restarted")
            return True
        finally:
            cell.source = source
        self._note(nb, cell, index)
        return False

    def _replay(self, nb: NotebookNode, upto: int, broken: set[int]) -> bool:
        """Run the earlier code cells (not tests, not the cells that broke a kernel) again; False if that fails."""
        for i, cell in enumerate(nb.cells[:upto]):
            if cell.cell_type != "code" or utils.is_grade(cell) or i in broken:
                continue
            self._kept[i] = 0
            try:
                self.execute_cell(copy.deepcopy(cell), i, store_history=False)
            except (DeadKernelError, CellTimeoutError):
                return False
        return True

    def _fail(self, nb: NotebookNode, cell: NotebookNode, ename: str, evalue: str, line: str) -> None:
        error = new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
        cell.outputs = [*cell.get("outputs", []), error]
        add_line(nb, line)

    def _skip(self, nb: NotebookNode, start: int) -> None:
        for cell in nb.cells[start:]:
            if cell.cell_type == "code":
                cell.outputs = [new_output("error", ename="NotRun", evalue="not run: the kernel kept failing",
                                           traceback=["NotRun: not run: the kernel kept failing"])]

    def _note(self, nb: NotebookNode, cell: NotebookNode, index: int) -> None:
        """Report an interrupted timeout, a limit of the box hit, or dropped output of a cell that finished."""
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError" for o in outputs):
            add_line(nb, f"{cell_label(cell, index)} timed out after {self.timeout} s and was interrupted")
        if self._limits is not None:
            line = limit_hit(outputs, self._limits)
            if line:
                add_line(nb, f"{line} in {cell_label(cell, index)}; tests before it still count")
        if not _count(cell.get("execution_count")):  # from the kernel's reply, not an iopub message
            self._forged.setdefault(index, []).append("a reply whose execution_count is not a number")
            cell.execution_count = None
        forged = self._forged.pop(index, [])
        if forged:
            what = f"{forged[0]}{f' (and {len(forged) - 1} more)' if len(forged) > 1 else ''}"
            cell.outputs.append(new_output("error", ename=FORGED, evalue=f"the kernel sent {what}: dropped",
                                           traceback=[f"{FORGED}: the kernel sent {what}: dropped"]))
            add_line(nb, f"{cell_label(cell, index)}: the kernel sent {what}: dropped, and the cell counts as failed")
        dropped = self._dropped.pop(index, 0)
        if dropped:
            cell.outputs.append(new_output("stream", name="stdout", text=f"\n... {dropped:,} bytes of output dropped"))
            add_line(nb, f"{cell_label(cell, index)} printed more than {self.max_output_bytes:,} bytes: the rest "
                         "was dropped")

    def process_message(self, msg: dict, cell: NotebookNode, cell_index: int) -> NotebookNode | None:
        """nbclient's, for a message in the form the grader reads (`message_problem`) and within the cell's output
        budget; any other is dropped (and counted, for `_note`)."""
        problem = message_problem(msg)
        if problem is not None:
            self._forged.setdefault(cell_index, []).append(problem)
            return None
        if msg["msg_type"] in OUTPUT_TYPES:
            size = len(json.dumps(msg["content"], default=str))
            kept = self._kept.get(cell_index, 0)
            if kept + size > self.max_output_bytes:
                self._dropped[cell_index] = self._dropped.get(cell_index, 0) + size
                return None
            self._kept[cell_index] = kept + size
        return super().process_message(msg, cell, cell_index)


def limit_line(kind: str, limits: Limits) -> str:
    """"kernel ran out of memory (limit 3 GB for the kernel and every process it starts)" for kind "memory"."""
    what = next(what for k, _, what in LIMIT_SIGNS if k == kind)
    return f"{what} (limit {limits.describe(kind)})"


def limit_hit(outputs: list, limits: Limits) -> str | None:
    """The `limit_line` of the limit of the box that a cell's errors (or the failure a check recorded) show it
    hit; None if none."""
    text = json.dumps([o for o in outputs if o.get("output_type") == "error"
                       or o.get("output_type") == "display_data"])
    for kind, signs, _ in LIMIT_SIGNS:
        if any(sign in text for sign in signs):
            return limit_line(kind, limits)
    return None


def with_box(execute_class: type, box: Box) -> type:
    """RobustExecute (or a configured subclass of it) whose kernels run in `box`, a worker's box."""
    if not issubclass(execute_class, RobustExecute):
        raise TypeError(f"{execute_class.__name__} cannot run kernels in the sandbox: configure "
                        f"{RobustExecute.__module__}.RobustExecute (or a subclass) as the Execute preprocessor")
    return type(f"Boxed{execute_class.__name__}", (execute_class,), {"box": box})
