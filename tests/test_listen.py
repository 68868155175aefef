"""Where a segment's data plane listens and what its clients are told (``runtime.listen``),
on real loopback sockets: a port range an operator opened in a firewall, and the
advertised name of a node that clients reach through a NAT."""

from __future__ import annotations

import asyncio
import socket

import pytest
from ports import free_port_range  # tests/ is on sys.path under pytest

from actors.segment.data_plane import DataPlaneServer, PolicyWatch
from runtime import wire
from runtime.errors import InvalidArgumentError, UnavailableError
from runtime.listen import (
    ADVERTISED_HOST_ENV,
    BIND_ENV,
    PORTS_ENV,
    PortRange,
    addresses,
    port_range,
)


def admit_all(credential: str | None, access: int) -> None:
    """Every HELLO is let in (admission has its own tests)."""


def _server() -> DataPlaneServer:
    return DataPlaneServer(lambda bodies: [], _never, admit_all, PolicyWatch(lambda: 0))


async def _never(body: bytes) -> bytes:
    raise AssertionError("no frame is sent here")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), (" ", None), ("9100-9199", PortRange(9100, 9199)), ("9100", PortRange(9100, 9100)),
     (" 1-65535 ", PortRange(1, 65535))],
)  # fmt: skip
def test_a_port_range_is_read_from_its_variable(value: str, expected: PortRange | None) -> None:
    assert port_range({PORTS_ENV: value}) == expected
    assert port_range({}) is None


@pytest.mark.parametrize(
    "value", ["9200-9100", "0-10", "1-65536", "ninety", "9100-", "-9100", "9100-a", "1-2-3"]
)
def test_a_bad_port_range_names_the_variable_and_what_is_allowed(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{PORTS_ENV}=.*such as 9100-9199"):
        port_range({PORTS_ENV: value})


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, ("10.0.0.7", "10.0.0.7")),
     ({BIND_ENV: " ", ADVERTISED_HOST_ENV: ""}, ("10.0.0.7", "10.0.0.7")),
     ({ADVERTISED_HOST_ENV: "broker-7.example"}, ("10.0.0.7", "broker-7.example")),
     ({BIND_ENV: "127.0.0.1"}, ("127.0.0.1", "127.0.0.1")),
     ({BIND_ENV: "0.0.0.0"}, ("0.0.0.0", "10.0.0.7")),
     ({BIND_ENV: "::", ADVERTISED_HOST_ENV: "b7"}, ("::", "b7"))],
)  # fmt: skip
def test_a_node_listens_on_its_ip_or_its_bind_and_tells_its_advertised_name(
    env: dict[str, str], expected: tuple[str, str]
) -> None:
    assert addresses("10.0.0.7", env) == expected


def test_data_planes_take_free_ports_of_the_range_and_say_when_none_is_left() -> None:
    free = free_port_range(3)
    ports = PortRange(free[0], free[-1])

    async def scenario() -> None:
        squatter = socket.socket()  # another program holds the range's first port
        squatter.bind(("127.0.0.1", ports.first))
        squatter.listen()
        servers = [_server(), _server(), _server()]
        try:
            first = await servers[0].start("127.0.0.1", None, ports, "localhost")
            second = await servers[1].start("127.0.0.1", None, ports)
            assert (first.port, second.port) == (ports.first + 1, ports.last)
            assert (first.host, second.host) == ("localhost", "127.0.0.1")
            with pytest.raises(UnavailableError, match=rf"no free port in {PORTS_ENV}={ports}"):
                await servers[2].start("127.0.0.1", None, ports)
            # what a client is told is where it connects: the advertised name answers
            reader, writer = await asyncio.open_connection(first.host, first.port)
            writer.write(wire.encode_hello("any", wire.PRODUCE))
            (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
            assert wire.decode_welcome(await reader.readexactly(length)) == wire.PRODUCE
            writer.close()
        finally:
            squatter.close()
            for server in servers:
                if server.endpoint is not None:
                    server.stop()

    asyncio.run(scenario())
