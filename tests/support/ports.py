"""Free loopback TCP ports for the servers the tests start.

Why not just bind port 0 and hand the number out: the kernel picks port-0 ports from the
ephemeral range (32768-60999 here), the same range it uses for the source ports of
outgoing connections, so a released port can be grabbed by some client socket before our
server binds it. Several engineers and pytest sessions share this machine, so we pick
random ports *below* the ephemeral range (20000 up to the range's start, read from
``/proc/sys/net/ipv4/ip_local_port_range``; above it on a machine whose range starts
too low), check that each binds, and never
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


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The ports the kernel picks for outgoing connections (Linux's default if unknown)."""
    try:
        with open(path, encoding="ascii") as ranges:
            low, high = (int(field) for field in ranges.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def pick_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """Ports for test servers: 20000 up to the ephemeral range; above it when the range
    starts too low to leave 1000 ports; 20000-32767 (a race is possible) if neither does.

    >>> pick_range((32768, 60999)), pick_range((1024, 60999)), pick_range((1024, 65535))
    ((20000, 32767), (61000, 65535), (20000, 32767))
    """
    low, high = ephemeral
    if low - 20000 >= 1000:
        return 20000, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    return 20000, 32767


LOW, HIGH = pick_range(ephemeral_range())
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
    """A port of ``LOW``-``HIGH`` (outside the ephemeral range) that binds now and was not
    handed out before here."""
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
