"""Ports for the servers the tests start (S3 servers, gateways, Ray heads, Redis).

A port is often chosen long before its server binds it: the S3 servers' ports go into
the operator's tier list when the session starts, and their servers start when a test
first needs one, maybe half an hour later. A port the kernel handed out (bind to 0) is
in its ephemeral range, which every outgoing connection and every component Ray or
Spark starts on "any free port" draws from meanwhile: the server then finds its port
taken, and a test talks to somebody else's server. So ports are drawn at random from
below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) and above Ray's
default worker range (10002-19999), where nothing is handed out unasked, and checked
free when drawn.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FIRST = 20_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()


def _last() -> int:
    """The last port below the kernel's ephemeral range."""
    try:
        return int(_RANGE_FILE.read_text().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        return 32_767  # Linux's default range starts at 32768


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nobody listens on now and nothing will be handed unasked; never the same
    twice in one process."""
    last = max(_last(), _FIRST + 1000)
    while True:
        port = random.randint(_FIRST, last)
        if port not in _given and _free(port):
            _given.add(port)
            return port


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


def free_port_range(count: int) -> range:
    """``count`` consecutive ports as ``free_port`` chooses each: for a server that
    is given a range (a data plane behind a firewall, ``runtime.listen``)."""
    last = max(_last(), _FIRST + 1000) - count
    while True:
        first = random.randint(_FIRST, last)
        ports = range(first, first + count)
        if _given.isdisjoint(ports) and all(_free(port) for port in ports):
            _given.update(ports)
            return ports
