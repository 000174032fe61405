"""What a graded kernel's environment holds: the variables `confine.KERNEL_VARIABLES` names, nothing else.

The grader's environment below is what an instructor's JupyterHub server gives `nbgrader autograde` run in its
terminal (the spawner's JPY_API_TOKEN and JUPYTERHUB_* variables), plus a database password and arbitrary
credentials. tests/test_grading_sandbox.py checks the same end to end: a kernel printing its environment.
"""

from __future__ import annotations

import pytest

from gptcourse.grading.box.confine import box_environment, kernel_variables
from gptcourse.grading.cases import kernel_environment

CREDENTIALS = {
    "JPY_API_TOKEN": "hub-api-token-1",
    "JUPYTERHUB_API_TOKEN": "hub-api-token-2",
    "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
    "JUPYTERHUB_USER": "instructor",
    "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-instructor",
    "JUPYTERHUB_OAUTH_CALLBACK_URL": "/user/instructor/oauth_callback",
    "PGPASSWORD": "gradebook-password",
    "GPTCOURSE_SECRET": "course-secret",
    "GPTCOURSE_DB_URL": "postgresql://nbgrader:pw@db/gptcourse",
    "GITHUB_TOKEN": "ghp_123",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "MY_SERVICE_TOKEN": "token-3",
    "JPY_SESSION_NAME": "/home/instructor/course/grading",
    "PYTHONSTARTUP": "/home/instructor/.pythonrc",  # would run the instructor's file in every kernel
}
NEEDED = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
          "NBGRADER_EXECUTION": "autograde"}


@pytest.mark.parametrize("build", [box_environment, kernel_variables], ids=["box", "unboxed"])
def test_no_credential_of_the_grader_reaches_a_kernel(build):
    grader = {**CREDENTIALS, **NEEDED, "PATH": "/opt/instructor/bin:/usr/bin", "HOME": "/home/instructor"}
    env = build(kernel_environment("02_causal_attention", "alice", grader))
    assert not set(CREDENTIALS) & set(env), sorted(set(CREDENTIALS) & set(env))
    assert not [value for value in CREDENTIALS.values() if value in repr(env)]
    assert {name: env[name] for name in NEEDED} == NEEDED  # what shapes Python and torch still arrives
    assert env["GPTCOURSE_HIDDEN_SEEDS"].startswith("02.")


def test_the_box_sets_its_own_home_and_path():
    env = box_environment({"PATH": "/opt/instructor/bin", "HOME": "/home/instructor"})
    assert env["HOME"] == env["TMPDIR"] == "/tmp" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
