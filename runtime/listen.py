"""Where a segment's data plane listens, and the address its clients are told.

By default a segment listens on its node's IP address, at a port the kernel picks, and
tells clients exactly that: right for clients inside the cluster's network (Ray
drivers). A client outside it (``Producer(url=...)``) may reach the nodes only through
a firewall or a NAT. The operator then opens a port range (``RAYTOPICS_DATA_PLANE_PORTS``,
a setting of the whole cluster like any other) and gives each node the name clients
reach it by (``RAYTOPICS_ADVERTISED_HOST`` in the environment of that node's ``ray
start``), as Kafka's ``advertised.listeners`` does. The segment still listens on the
node's own address unless that node's ``RAYTOPICS_DATA_PLANE_BIND`` says another
(``0.0.0.0``: every interface), as Kafka's ``listeners``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from runtime.errors import InvalidArgumentError

PORTS_ENV = "RAYTOPICS_DATA_PLANE_PORTS"
ADVERTISED_HOST_ENV = "RAYTOPICS_ADVERTISED_HOST"
BIND_ENV = "RAYTOPICS_DATA_PLANE_BIND"
NODE_ENV = (ADVERTISED_HOST_ENV, BIND_ENV)  # a node's own: from its `ray start`


@dataclass(frozen=True)
class PortRange:
    """The ports ``first`` to ``last`` (both included) a data plane may listen on."""

    first: int
    last: int

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.last + 1))

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def port_range(env: Mapping[str, str] = os.environ) -> PortRange | None:
    """``RAYTOPICS_DATA_PLANE_PORTS`` (``9100-9199``, or one port): ``None`` when unset,
    any free port then. ``InvalidArgumentError`` naming the variable otherwise."""
    raw = env.get(PORTS_ENV, "").strip()
    if not raw:
        return None
    first, dash, last = raw.partition("-")
    try:
        ports = PortRange(int(first), int(last if dash else first))
    except ValueError:
        ports = None
    if ports is None or not 1 <= ports.first <= ports.last <= 65_535:
        raise InvalidArgumentError(
            f"{PORTS_ENV}={raw!r}: give a port or a range of them, such as 9100-9199 "
            "(1 to 65535, the first not above the last)"
        )
    return ports


WILDCARDS = ("0.0.0.0", "::")  # every interface: not an address a client can be told


def addresses(node_ip: str, env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Where the data plane listens and the host its clients are told: this node's
    ``RAYTOPICS_DATA_PLANE_BIND`` (else its IP address, the one Ray uses) and its
    ``RAYTOPICS_ADVERTISED_HOST`` (else the address listened on, or the node's IP
    address when that is every interface)."""
    bind = env.get(BIND_ENV, "").strip() or node_ip
    told = env.get(ADVERTISED_HOST_ENV, "").strip() or (node_ip if bind in WILDCARDS else bind)
    return bind, told
