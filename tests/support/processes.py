"""Start a server process in its own process group, log it to a file, and always stop it.

Why: vLLM forks an ``EngineCore`` child (even with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
and a multiprocessing resource tracker; killing only the parent leaves ~600 MB orphans on
a machine shared by several engineers. Each server is therefore started with
``start_new_session=True`` and stopped by signalling its whole process group: SIGTERM,
wait, then SIGKILL for whatever is left. Only the group of a process we started is ever
signalled.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.waiting import WaitTimeoutError, wait_until


class ManagedProcess:
    """One server process (and its children) with its output in ``log_path``."""

    def __init__(
        self, argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("process not started")
        return self.proc.pid

    def start(self) -> None:
        if self.running():
            raise RuntimeError(f"already running: pid {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, wait up to ``timeout`` s, then SIGKILL what remains."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the group at once (a crash, as far as clients can tell)."""
        self._signal_and_wait(signal.SIGKILL, 5.0)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # leader of its own session, so pgid == pid
        if self.proc.poll() is not None and not _group_alive(pgid):
            return  # already gone, children too
        _killpg(pgid, sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        # Children (vLLM's EngineCore) may outlive the leader: give them a moment, then kill.
        with contextlib.suppress(WaitTimeoutError):
            wait_until(lambda: not _group_alive(pgid), min(timeout, 5.0), "the group gone")
        if _group_alive(pgid):
            _killpg(pgid, signal.SIGKILL)

    def rss_bytes(self) -> int:
        """Resident memory of the process and all its descendants (Linux /proc)."""
        if not self.running():
            return 0
        return sum(_rss(pid) for pid in [self.pid, *descendants(self.pid)])

    def log_errors(self, lines: int = 10) -> str:
        """The last ``lines`` log lines naming an exception (``...Error:``), root causes first.

        A failing vLLM start logs the root cause (e.g. ``ValueError: ... maximum model
        length is 1920``) far above the end of the log, under several tracebacks.
        """
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        found = [line for line in text.splitlines() if _ERROR_LINE.search(line)]
        return "\n".join(found[-lines:])

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(Error|Exception)\b:")


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent pid; the command name (field 2) may contain spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """The pids of every process below ``pid`` (children, their children...)."""
    children = _children_map()
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
