"""The Hub's files without a Hub: deploy/jupyterhub/jupyterhub_config.py turns `gptcourse hub setup`'s settings into
the JupyterHub settings the class needs, and the Zero to
JupyterHub files (deploy/z2jh/) parse and hold the same choices. tests/browser/test_hub.py runs the real Hub."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from traitlets.config import PyFileConfigLoader

from gptcourse import hub

ROOT = Path(__file__).resolve().parents[1]
Z2JH = ROOT / "deploy" / "z2jh"
# Dockerfile instructions (docs.docker.com/reference/dockerfile)
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def settings(tmp_path: Path, **changes: object) -> hub.HubSettings:
    values = dict(course_id="gptcourse", instructor="teacher", students=["ada", "alan"], python="/opt/class/venv",
                  state=str(tmp_path), exchange="/srv/nbgrader/exchange", course_dir="/home/teacher/gptcourse",
                  jupyter_config=str(tmp_path / "jupyter-config"), jupyter_data=str(tmp_path / "jupyter-data"),
                  gradebook_url=hub.gradebook_url("teacher", "gradebook", "/var/run/postgresql", 5432),
                  proxy="/usr/bin/configurable-http-proxy", mathjax="/opt/mathjax")
    values.update(changes)
    return hub.HubSettings(**values)  # type: ignore[arg-type]


def load_hub_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: hub.HubSettings):
    path = tmp_path / "hub.json"
    path.write_text(json.dumps(asdict(config)))
    monkeypatch.setenv("GPTCOURSE_HUB_SETTINGS", str(path))
    return PyFileConfigLoader(hub.HUB_CONFIG.name, str(hub.HUB_CONFIG.parent)).load_config()


def test_a_class_hub_uses_pam_and_each_persons_own_account(tmp_path, monkeypatch):
    config = load_hub_config(tmp_path, monkeypatch, settings(tmp_path))
    assert config.JupyterHub.authenticator_class == "pam"
    assert config.Authenticator.allowed_users == {"teacher", "ada", "alan"}
    assert config.Authenticator.admin_users == set()  # nobody reaches another person's server
    assert config.JupyterHub.spawner_class == "localprocess"
    assert config.Spawner.cmd == ["/opt/class/venv/bin/jupyterhub-singleuser"]
    assert config.JupyterHub.load_groups == {"formgrade-gptcourse": {"users": ["teacher"]},
                                             "nbgrader-gptcourse": {"users": ["ada", "alan"]}}
    [server] = [role for role in config.JupyterHub.load_roles if role["name"] == "server"]
    assert not {"inherit", "admin:users", "admin:servers"} & set(server["scopes"])
    assert "read:users:groups!user" in server["scopes"]  # JupyterHubAuthPlugin reads the user's own groups
    [mathjax] = config.JupyterHub.services
    assert mathjax["name"] == "mathjax" and "/opt/mathjax" in mathjax["command"]


def test_students_servers_read_the_students_config_first(tmp_path, monkeypatch):
    config = load_hub_config(tmp_path, monkeypatch, settings(tmp_path))
    paths = {}
    for name in ("ada", "teacher"):
        spawner = SimpleNamespace(user=SimpleNamespace(name=name), environment=dict(config.Spawner.environment))
        config.Spawner.pre_spawn_hook(spawner)
        paths[name] = spawner.environment["JUPYTER_CONFIG_PATH"].split(":")
    assert paths["ada"] == [str(tmp_path / "jupyter-config-students"), str(tmp_path / "jupyter-config")]
    assert paths["teacher"] == [str(tmp_path / "jupyter-config")]


def test_the_gradebook_url_is_peer_authenticated_over_the_socket():
    from sqlalchemy.engine import make_url

    url = make_url(hub.gradebook_url("teacher", "gradebook", "/var/run/postgresql", 5433))
    assert (url.drivername, url.username, url.password, url.database) == ("postgresql+psycopg", "teacher", None,
                                                                          "gradebook")
    assert url.query == {"host": "/var/run/postgresql", "port": "5433"} and url.host is None


def test_the_instructors_block_sets_what_nbgrader_reads(tmp_path):
    block = hub.hub_block(settings(tmp_path))
    namespace = {"c": SimpleNamespace(CourseDirectory=SimpleNamespace(), Exchange=SimpleNamespace())}
    exec(compile(block, "hub_block", "exec"), namespace)
    assert namespace["c"].CourseDirectory.db_url.startswith("postgresql+psycopg://teacher@/gradebook?")
    assert namespace["c"].Exchange.root == "/srv/nbgrader/exchange"


def test_z2jh_values_parse_and_hold_the_class():
    values = yaml.safe_load((Z2JH / "values.yaml").read_text())
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] == "native"
    volumes = values["singleuser"]["storage"]["extraVolumes"]
    assert {"name": "exchange", "persistentVolumeClaim": {"claimName": "nbgrader-exchange"}} in volumes
    for name, source in values["hub"]["extraConfig"].items():
        compile(source, f"hub.extraConfig.{name}", "exec")  # the Hub runs these as Python
    nbgrader_config = values["singleuser"]["extraFiles"]["nbgrader-config"]["stringData"]
    compile(nbgrader_config, "nbgrader_config.py", "exec")
    assert 'c.Exchange.root = "/srv/nbgrader/exchange"' in nbgrader_config
    # the same server scopes as on one machine
    machine = {role["name"]: role["scopes"] for role in load_roles_of_the_machine()}
    assert values["hub"]["loadRoles"]["server"]["scopes"] == machine["server"]
    students = values["singleuser"]["extraFiles"]
    assert students["students-server-config"]["data"] == hub.STUDENTS_SERVER_CONFIG
    assert students["students-lab-config"]["data"] == hub.STUDENTS_LAB_CONFIG


def load_roles_of_the_machine() -> list[dict]:
    source = hub.HUB_CONFIG.read_text()
    start = source.index("c.JupyterHub.load_roles = ")
    return eval(source[start + len("c.JupyterHub.load_roles = "):].split("\n]\n")[0] + "\n]")


def test_z2jh_dockerfile_parses():
    lines, current = [], ""
    for raw in (Z2JH / "Dockerfile").read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    words = [line.split()[0] for line in lines]
    assert words[0] == "FROM" and set(words) <= INSTRUCTIONS, words
    pin = re.search(r"^torch==\S+", (ROOT / "requirements.txt").read_text(), re.MULTILINE).group(0)
    assert pin in " ".join(lines), f"the image's torch is not requirements.txt's {pin}"
    for line in lines:
        if line.startswith(("CMD", "ENTRYPOINT")):
            json.loads(line.split(None, 1)[1])  # exec form


@pytest.mark.parametrize("name", ["Ada", "ada;drop", "../ada", "", "a" * 33, "1ada"])
def test_setup_refuses_a_name_that_is_not_an_account_name(tmp_path, monkeypatch, name):
    monkeypatch.setattr(hub, "require_root", lambda: None)
    with pytest.raises(hub.HubSetupError, match="not an account or database name"):
        hub.setup(settings(tmp_path, students=["ada", name]), "psql", "/run/postgresql", 5432, "gradebook")


def test_create_env_refuses_a_python_other_accounts_cannot_run(tmp_path):
    """A base interpreter only root can reach (as pyenv's under /root) would give the class an environment no student
    runs: refused before anything is made, saying what to pass instead. /bin/true stands in for a Python."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("runs a program as `nobody`: needs root and runuser (CI runs as root)")
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    only_root = hidden / "python3"
    shutil.copy("/bin/true", only_root)
    assert hub.runs_for_everyone("/bin/true") and not hub.runs_for_everyone(only_root)
    with pytest.raises(hub.HubSetupError, match="--base-python"):
        hub.create_environment(str(tmp_path / "venv"), str(only_root))
    assert not (tmp_path / "venv").exists()
