"""A throwaway PostgreSQL server on loopback, for the tests and benchmarks that need a gradebook several
processes write at once: Debian's `postgresql` package, run from a temporary data folder (as the `postgres` user
when this runs as root: the server refuses root), stopped and deleted afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def postgres_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/VERSION/bin; None if neither."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def throwaway_server(bindir: Path) -> Iterator[str]:
    """postgresql://postgres@127.0.0.1:PORT/gradebook: a fresh server from `bindir` (`postgres_bin()`) with an
    empty database `gradebook`; needs psycopg."""
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="gptcourse-pg-"))
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()

    def run(*command: str) -> None:
        proc = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync")
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-o",
            f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off", "start")
        try:
            url = f"postgresql://postgres@127.0.0.1:{port}/gradebook"
            create_database(url, "gradebook")
            yield url
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """A new empty database `name` on the server of `server_url` (any database's URL there): its URL."""
    import psycopg

    admin_url = server_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:  # CREATE DATABASE runs outside a transaction
        admin.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"
