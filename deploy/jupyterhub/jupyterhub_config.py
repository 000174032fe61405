"""JupyterHub for one class of the course: `gptcourse hub start` runs `jupyterhub -f` on this file.

Everything that differs between two classes (who teaches, who takes it, where things live, the ports) is data, in
the JSON file that `gptcourse hub setup` writes (its path in GPTCOURSE_HUB_SETTINGS); this file only turns it into
JupyterHub's settings:

- each person's server is `jupyterhub-singleuser` from the class's Python environment (under /opt or /srv, readable
  by every user), started by the LocalProcessSpawner as that person's own Unix user, in their home folder;
- log in with PAM: the Unix accounts and passwords `gptcourse hub setup` made (the end-to-end test logs in so too);
- nbgrader's groups: formgrade-<course> (the instructor: the formgrader runs in their own server) and
  nbgrader-<course> (the students: nbgrader's JupyterHubAuthPlugin shows them the course's assignments);
  each single-user server's token may read its own user's groups, nothing more than nbgrader needs;
- every server gets the class's Jupyter config folder (exchange root, course id, the auth plugin) on
  JUPYTER_CONFIG_PATH, a student's after a folder that turns nbgrader's formgrader and authoring tools off; the
  instructor's ~/.jupyter/nbgrader_config.py loads the course's own, which holds the gradebook's PostgreSQL
  address and the grading sandbox's settings;
- MathJax from the Hub itself (the `mathjax` service, /services/mathjax/) for the formgrader and the feedback pages,
  whose templates otherwise load it from a CDN.
"""

import json
import os
import sys

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)

SETTINGS_FILE = os.environ.get("GPTCOURSE_HUB_SETTINGS", "")
if not SETTINGS_FILE:
    sys.exit("GPTCOURSE_HUB_SETTINGS is not set: start the Hub with `gptcourse hub start` (after `hub setup`)")
with open(SETTINGS_FILE, encoding="utf-8") as settings_file:
    hub = json.load(settings_file)

course, instructor, students = hub["course_id"], hub["instructor"], hub["students"]
private = os.path.join(hub["state"], "private")  # root's: the Hub's database, cookie secret, proxy token

c.JupyterHub.bind_url = f"http://{hub['ip']}:{hub['port']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = hub["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{hub['proxy_api_port']}"
c.ConfigurableHTTPProxy.pid_file = os.path.join(private, "proxy.pid")
c.ConfigurableHTTPProxy.command = [hub["proxy"]]
c.JupyterHub.db_url = "sqlite:///" + os.path.join(private, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(private, "cookie_secret")
c.JupyterHub.pid_file = os.path.join(private, "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the Hub stops every single-user server

# Who may log in: the class's Unix accounts, each with its own password (PAM's `login` service, as the Hub runs as
# root it may check /etc/shadow).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no systemd-logind session per server
c.Authenticator.allowed_users = {instructor, *students}
c.Authenticator.admin_users = set()  # nobody may reach another person's server, the instructor included

# Each server: the class's environment, as its own Unix user, at home.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [os.path.join(hub["python"], "bin", "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": hub["jupyter_config"],
    "PATH": os.pathsep.join([os.path.join(hub["python"], "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
    "OMP_NUM_THREADS": str(hub.get("threads", 1)),
}
c.LocalProcessSpawner.notebook_dir = "~"


def students_without_formgrader(spawner):
    """A student's server reads the students' config folder first: no formgrader, no assignment authoring."""
    if spawner.user.name != instructor:
        spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join([hub["jupyter_config"] + "-students",
                                                                      hub["jupyter_config"]])


c.Spawner.pre_spawn_hook = students_without_formgrader

# Math without the internet: MathJax from the Hub's own service, used by the formgrader and the feedback pages.
if hub.get("mathjax"):
    c.JupyterHub.services = [{
        "name": "mathjax", "url": f"http://127.0.0.1:{hub['mathjax_port']}", "display": False,
        "command": [sys.executable, "-m", "gptcourse.cli", "hub", "mathjax", hub["mathjax"],
                    "--port", str(hub["mathjax_port"])],
    }]
    c.Spawner.environment["JUPYTER_PATH"] = hub["jupyter_data"]

# nbgrader's groups and what each server's token may do (read its own user's groups: JupyterHubAuthPlugin).
c.JupyterHub.load_groups = {
    f"formgrade-{course}": {"users": [instructor]},
    f"nbgrader-{course}": {"users": list(students)},
}
c.JupyterHub.load_roles = [
    {"name": "server", "scopes": ["access:servers!user", "users:activity!user", "read:users:groups!user",
                                  "read:users:name!user"]},
]
