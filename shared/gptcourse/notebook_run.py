"""Run a notebook top to bottom headless (as Run All in JupyterLab does), without ever stalling on a widget.

nbclient, which `jupyter nbconvert --execute` and nbgrader run notebooks with, stands in for JupyterLab's
Output widget: when a cell shows one (`ipywidgets.interact` does), nbclient sends the widget's new state to the
kernel on the shell socket while it is waiting on that same socket for the cell's reply. A send on a zmq
socket can swallow the wake-up of a message arriving at that moment, so now and then the reply is never read and
the run hangs with both sides idle until the cell's timeout (nbclient issue 312; seen here when lesson 01 ran
beside a training lesson). `headless_client` turns that capture off: a widget's printed output becomes the cell's
own output, and nothing but execute requests goes out on the shell socket.

    python -m gptcourse.notebook_run lessons/01_tokens_and_embeddings.ipynb   # exit status 1 if a cell fails
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient


def drop_widget_capture(client: NotebookClient) -> None:
    """Stop `client` from capturing Output widgets (and so from sending on the shell socket mid-cell)."""
    client.comm_open_handlers = {}


def headless_client(nb: nbformat.NotebookNode, **options: Any) -> NotebookClient:
    """A NotebookClient for `nb` (options as NotebookClient's) that never sends a widget's state to its kernel."""
    client = NotebookClient(nb, **options)
    drop_widget_capture(client)
    return client


def run_all(notebook: Path, timeout: int = 1800, allow_errors: bool = False,
            kernel_options: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """Execute `notebook` in a fresh kernel, in its own folder, and return it run; the file is not changed.
    Raises on a failing cell unless `allow_errors` (then the cell keeps its error as output, and the run goes on)."""
    nb = nbformat.read(notebook, as_version=4)
    headless_client(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                    extra_arguments=list(kernel_options),
                    resources={"metadata": {"path": str(notebook.parent)}}).execute()
    return nb


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m gptcourse.notebook_run NOTEBOOK.ipynb")
    run_all(Path(sys.argv[1]))
