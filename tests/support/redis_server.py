"""A real Redis server for the gateway's shared budget/concurrency counters.

Why: the gateway must keep admitting (or fail safe) when Redis dies and must recover when it
comes back; only a real server shows real connection errors. ``RedisServer`` runs the Debian
``redis-server`` (7.0) on a free loopback port with persistence off, and can be killed
(SIGKILL: a crash, clients see a reset) and started again *on the same port* with an empty
dataset.

Usage (the ``redis_server`` fixture in tests/conftest.py wraps this)::

    with RedisServer(work_dir=tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        server.kill()       # clients now get ConnectionError
        server.start()      # same port, empty data

Timing measured here: answers PING ~10-30 ms after start.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.waiting import StopWaitingError, WaitTimeoutError, wait_until

REDIS_BIN = "/usr/bin/redis-server"
READY_TIMEOUT_SECONDS = 10.0


RedisFactory = Callable[..., "RedisServer"]
"""Type of the ``redis_server`` fixtures: ``(port=None)`` -> a running server."""


def redis_binary() -> str | None:
    """Path of redis-server, or None when it is not installed."""
    if Path(REDIS_BIN).is_file():
        return REDIS_BIN
    return shutil.which("redis-server")


def ping(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """True when a Redis server on ``host:port`` answers ``PING`` with ``+PONG``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A redis-server process; a context manager (start on enter, stop on exit)."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        binary = redis_binary()
        if binary is None:
            raise FileNotFoundError("redis-server not installed (apt-get install redis-server)")
        self.work_dir = work_dir
        self.port = port if port is not None else free_port()
        work_dir.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(work_dir),
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            log_path=work_dir / "redis.log",
            env={"PATH": "/usr/bin:/bin"},
            cwd=work_dir,
        )
        self.starts = 0  # how many times start() succeeded

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = READY_TIMEOUT_SECONDS) -> RedisServer:
        """Start (or restart, same port) and block until it answers PING."""
        self.process.start()
        try:
            wait_until(self._answering_or_exited, timeout, "redis-server answering", interval=0.01)
        except WaitTimeoutError:
            self.process.kill()
            raise RuntimeError(f"redis-server not answering after {timeout} s") from None
        self.starts += 1
        return self

    def _answering_or_exited(self) -> bool:
        if not self.process.running():
            raise StopWaitingError(
                f"redis-server exited with {self.process.returncode()}:\n{self.process.log_tail()}"
            )
        return ping(self.port)

    def running(self) -> bool:
        return self.process.running()

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM)."""
        self.process.stop(timeout=5)

    def kill(self) -> None:
        """Crash it (SIGKILL): connected clients see the connection drop."""
        self.process.kill()

    def log_tail(self, lines: int = 80) -> str:
        return self.process.log_tail(lines)

    def restart(self) -> RedisServer:
        """Kill and start again on the same port (dataset empty: persistence is off)."""
        self.kill()
        return self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
