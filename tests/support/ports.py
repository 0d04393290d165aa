"""Free loopback TCP ports for the servers the tests start.

Why not just bind port 0 and hand the number out: the kernel picks port-0 ports from the
ephemeral range (32768-60999 here), the same range it uses for the source ports of
outgoing connections, so a released port can be grabbed by some client socket before our
server binds it. Several engineers and pytest sessions share this machine, so we pick
random ports *below* the ephemeral range (20000-32767), check that each binds, and never
hand out the same port twice in one process. A collision is still possible in theory (a
race between two sessions picking the same random port in the same instant); the servers'
start-up then fails with a clear "address in use" in their log.

Example::

    port = free_port()            # e.g. 24817
    url = f"http://127.0.0.1:{port}"
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32767
_handed_out: set[int] = set()


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` can be bound right now (no listener, no TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port in [20000, 32767] that binds now and was not handed out before here."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(LOW, HIGH)
        if port not in _handed_out and is_free(port, host):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port found in {LOW}-{HIGH} after 200 tries")


def is_listening(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
