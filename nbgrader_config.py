"""nbgrader's course directory is this repository: run nbgrader from the repo root, with no extra flags.

    solutions/NN_topic/NN_topic.ipynb           source (solutions and hidden tests)  -> nbgrader's "source"
    labs/NN_topic/NN_topic.ipynb                student version, generated           -> nbgrader's "release"
    grading/submitted/<student>/NN_topic/       collected submissions                (grading/ is git-ignored)
    grading/autograded/, grading/feedback/      nbgrader's output
    grading/gradebook.db                        the gradebook (SQLite)
    grading/refused/<lab>/<student>[.txt]       what intake refused of a submission (links kept as links), and why
    grading/grades.csv                          `nbgrader export`
    grading/downloaded/NN_topic/archive/        submissions downloaded from an LMS, for `nbgrader zip_collect`,
                                                named <student>_NN_topic.ipynb (or zips of such files)

The labs are the folders of solutions/; `nbgrader generate_assignment NN_topic` registers one in the gradebook.
nbgrader's default directory_structure "{nbgrader_step}/{student_id}/{assignment_id}" puts source and release
at <step>/./<lab>, i.e. exactly solutions/<lab>/ and labs/<lab>/.

Hidden tests draw their sizes and seeds from the course secret: the environment variable GPTCOURSE_SECRET or,
if it is unset, the first line of grading/secret.txt (git-ignored, like all of grading/). This file puts it in
the grader's environment. The student's kernel never gets it: it is started without GPTCOURSE_SECRET and with
GPTCOURSE_HIDDEN_SEEDS, the seeds of the graded lab's hidden cases for the student graded, so both sides of a
check agree and no cell can print the secret. Without either, the PUBLIC default of gptcourse.grading.cases is
used: fine for self-study and CI, not for a graded class.

`nbgrader autograde` runs with the protections of gptcourse.grading (see its docstring): a tolerant reader and
a cell restorer before execution, a kernel-restarting executor whose kernels run in a bubblewrap sandbox
(gptcourse.grading.box.sandbox: only the interpreter and the package in view, an unprivileged user, limits), the
out-of-kernel judge, outputs and student text stripped of active content (script, widgets), a report per
submission in grading/reports/<lab>/<student>.txt; `nbgrader generate_feedback` hides hidden tests. If the
sandbox cannot start, autograde stops before grading anyone and says how to fix it;
`c.Sandbox.allow_unsandboxed = True` grades without it (only in a throw-away machine).
"""

import os

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
ROOT = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = ROOT
c.CourseDirectory.course_id = "gptcourse"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.submitted_directory = os.path.join("grading", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("grading", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("grading", "feedback")
c.CourseDirectory.solution_directory = os.path.join("grading", "solution")
os.makedirs(os.path.join(ROOT, "grading"), exist_ok=True)  # SQLite creates the file, not its folder
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(ROOT, "grading", "gradebook.db")

c.CsvExportPlugin.to = os.path.join(ROOT, "grading", "grades.csv")  # `nbgrader export`
c.ZipCollectApp.downloaded_directory = os.path.join("grading", "downloaded")
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[^/_]+)_(?P<file_id>[^/]+\.ipynb)$"

# A submission is data until proven a plain notebook (gptcourse.grading.steps.intake): collect, zip_collect and
# autograde admit only regular files of allowed names and kinds, never through a link, and only allowed student
# ids; what they refuse goes to grading/refused/ with a report line. Grades' CSV cells cannot be formulas.
STEPS = "gptcourse.grading.steps."  # nbgrader's steps, one per module
CLASSROOM = "gptcourse.grading.classroom."  # the instructor's commands' plugins
c.ExchangeFactory.collect = STEPS + "intake.IntakeCollect"
c.ZipCollectApp.collector_plugin = STEPS + "intake.IntakeFileNameCollector"
c.ZipCollectApp.extractor_plugin = CLASSROOM + "archives.BoundedExtractor"
c.ExportApp.plugin_class = CLASSROOM + "csv_export.SafeCsvExportPlugin"

# A lab's cells are small; a minute per cell leaves room for a slow laptop and stops a runaway loop.
c.Execute.timeout = 60
# Kernels log only errors: ipykernel's warning that it talks to nbgrader over local TCP, which a student can
# do nothing about, would otherwise head every `nbgrader validate` report.
c.Execute.extra_arguments = ["--log-level=ERROR"]

SECRET_FILE = os.path.join(ROOT, "grading", "secret.txt")
if not os.environ.get("GPTCOURSE_SECRET") and os.path.isfile(SECRET_FILE):
    with open(SECRET_FILE, encoding="utf-8") as secret_file:
        os.environ["GPTCOURSE_SECRET"] = secret_file.readline().strip()

# Autograde: nbgrader's steps, with gptcourse's in between (named as strings: imported only when autograding).
c.Autograde.exporter_class = STEPS + "intake.AdmittingExporter"  # refuses ids before their gradebook rows


# The sandbox's limits per kernel (these are the defaults): memory for the kernel and every process it starts,
# together (also each process's address space), and how it is enforced ("auto": a memory cgroup per box where the
# grader can make one, else a watchdog in the zygote); processes and threads, largest file, size of /scratch,
# /tmp and /dev/shm (each); intra-op threads (0: torch's default; gptcourse autograde: its share of the cores).
c.Sandbox.memory_gb = 3.0
c.Sandbox.memory_bound = "auto"
c.Sandbox.max_processes = 256
c.Sandbox.file_size_mb = 256
c.Sandbox.scratch_mb = 256
c.Sandbox.threads = 0


def _missing_notebooks(assignment: str, student: str, notebooks: list[str]) -> None:
    """Before anything is graded: stop if the sandbox cannot start (SandboxUnavailable, unless the opt-out is
    set). Before nbgrader copies anything of the submission: admit it (intake.admit_for_autograde). A submission
    missing the lab's notebook (say, only a misnamed copy) is graded 0 with a report line; a
    submitted folder with no notebook at all, which nbgrader skips, gets a report that says so."""
    from gptcourse.grading.box.sandbox import require_sandbox
    from gptcourse.grading.steps.intake import admit_for_autograde, report_folders_without_notebook
    from gptcourse.grading.steps.report import WriteGradingReport
    from gptcourse.grading.steps.sanitize import expect_lab_notebooks

    require_sandbox(c, forbidden=[ROOT])
    admit_for_autograde(ROOT, notebooks)
    if not notebooks:  # its student id is not allowed, or its folder is a link: nothing of it is converted
        return
    expect_lab_notebooks(os.path.join(ROOT, c.CourseDirectory.source_directory), notebooks)
    report_folders_without_notebook(ROOT, notebooks, WriteGradingReport(config=c))


c.Autograde.pre_convert_hook = _missing_notebooks
c.Autograde.sanitize_preprocessors = [
    STEPS + "sanitize.RestoreCells",  # rebuild from the gradebook's cells: deleted/edited/retyped cells restored
    STEPS + "intake.ReportRefused",  # the files intake refused, in the report
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.Autograde.autograde_preprocessors = [
    STEPS + "execute.RobustExecute",  # survives dead and hung kernels, caps output, runs kernels in the sandbox
    "nbgrader.preprocessors.IgnorePattern",
    "nbgrader.preprocessors.LimitOutput",
    STEPS + "judge.JudgeTestCells",  # re-judges the recorded results here, where no student code ran
    STEPS + "active_content.SanitizeOutputs",  # outputs and student text as data: no script, no widgets
    "nbgrader.preprocessors.SaveAutoGrades",
    STEPS + "verdict_comments.CommentVerdicts",  # each piece's verdict as its solution cell's comment (gradebook)
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
    STEPS + "report.WriteGradingReport",  # grading/reports/<lab>/<student>.txt and a cell atop the notebook
]
c.GenerateFeedback.preprocessors = [
    STEPS + "feedback.HideHiddenTests",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
