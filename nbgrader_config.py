"""nbgrader's course directory is this repository: run nbgrader from the repo root, with no extra flags.

    solutions/NN_topic/NN_topic.ipynb           source (solutions and hidden tests)  -> nbgrader's "source"
    labs/NN_topic/NN_topic.ipynb                student version, generated           -> nbgrader's "release"
    grading/submitted/<student>/NN_topic/       collected submissions                (grading/ is git-ignored)
    grading/autograded/, grading/feedback/      nbgrader's output
    grading/gradebook.db                        the gradebook (SQLite)
    grading/grades.csv                          `nbgrader export`
    grading/downloaded/NN_topic/archive/        submissions downloaded from an LMS, for `nbgrader zip_collect`,
                                                named <student>_NN_topic.ipynb (or zips of such files)

The labs are the folders of solutions/; `nbgrader generate_assignment NN_topic` registers one in the gradebook.
nbgrader's default directory_structure "{nbgrader_step}/{student_id}/{assignment_id}" puts source and release
at <step>/./<lab>, i.e. exactly solutions/<lab>/ and labs/<lab>/.

Hidden tests draw their sizes and seeds from the environment variable GPTCOURSE_SECRET (see
gptcourse.grading.cases); export a private value before `nbgrader autograde` when grading a real class.
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

# A lab's cells are small; a minute per cell leaves room for a slow laptop and stops a runaway loop.
c.Execute.timeout = 60
