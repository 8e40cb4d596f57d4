"""Servers for the service tests: the app in a thread (uvicorn), ``assay serve`` as a process, PostgreSQL.

Everything listens on 127.0.0.1 only, and every wait is bounded by a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.requirements import in_ci

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, deadline_s: float = 60.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"no server answered at {url} within {deadline_s} s")


class ThreadServer:
    """An ASGI app served by uvicorn in a thread of this process, on a loopback port."""

    def __init__(self, app):
        import uvicorn

        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", loop="asyncio")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> "ThreadServer":
        self._thread.start()
        wait_healthy(self.url, 30.0)
        return self

    def __exit__(self, *_exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()


def serve_process(store: str, port: int, *arguments: str) -> subprocess.Popen:
    """``assay serve`` as a child process (started through the console script's module)."""
    command = [sys.executable, "-m", "assay.cli.main", "serve", "--store", store, "--port", str(port), *arguments]
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment,
                               cwd=REPO_ROOT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 90.0, process)
    except BaseException:
        stop_process(process, signal.SIGKILL)
        raise
    return process


def stop_process(process: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def missing_program(program: str, package: str):
    """A system program is missing: fail in CI (the set-up installs it), skip elsewhere, saying how to get it."""
    message = (f"the test needs {program!r} from the Debian package {package!r}: run `sudo bash tests/system_setup.sh` "
               f"(which `make test` runs when root) or `apt-get install {package}`")
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def find_postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


class PostgresServer:
    """A throw-away PostgreSQL cluster in a temp folder, on a loopback port, run by a non-root user.

    The folder is made with :func:`tempfile.mkdtemp` (not pytest's, whose parents only root may
    enter) and removed at the end.
    """

    def __init__(self):
        self.bin = find_postgres_bin()
        if self.bin is None:
            missing_program("initdb", "postgresql")
        self.folder = Path(tempfile.mkdtemp(prefix="assay-postgres-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as the postgres user
            user = "postgres"
            try:
                import pwd

                pwd.getpwnam(user)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", user], check=True)
            subprocess.run(["chown", "-R", user, str(self.folder)], check=True)
            os.chmod(self.folder, 0o755)
            self._as_user = ["runuser", "-u", user, "--"]

    def _run(self, *command: str, timeout: float = 120.0) -> None:
        done = subprocess.run([*self._as_user, *command], timeout=timeout, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")

    def __enter__(self) -> "PostgresServer":
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w",
                  "-t", "60", "start")
        return self

    def __exit__(self, *_exc) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        except (RuntimeError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.folder, ignore_errors=True)
