"""How a maintenance round asks the replicas of replicated segments, without Ray (segment
hosts are stand-ins; data planes are real sockets on loopback):

- every replica's status with one call per segment host, not one per replica;
- a host that does not answer soon has its replicas' data planes probed: one that refuses
  connections is dead (reported at once, not after the wait), one that accepts them is
  only slow (its answer is still taken when it comes);
- a probe proves something only when refused.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from actors.control import replica_asks
from actors.control.replica_asks import ask_replicas, refuses
from runtime.layout import HashRange, SegmentInfo
from runtime.names import MAX_HASH, TopicName
from storage.replica_sets import ReplicaSet

TOPIC = TopicName.parse("topic://tenant/ns/orders")


def closed_port() -> tuple[str, int]:
    """An address where nothing listens (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()


@pytest.fixture
def listening() -> Iterator[tuple[str, int]]:
    """An address where a socket listens and never accepts: a paused process's data plane
    (its kernel completes connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()


@pytest.fixture(autouse=True)
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_asks, "guard", lambda: SimpleNamespace(internal_token=str))
    monkeypatch.setattr(replica_asks, "topic_settings", lambda: None)
    monkeypatch.setattr(
        replica_asks, "host_name", lambda name, node, hosts, settings: f"host-{node}"
    )


class Host:
    """A segment host that answers ``replica_statuses`` after ``delay_s`` (never: None)."""

    calls: list[tuple[str, list[str]]] = []
    delays: dict[str, float | None] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.replica_statuses = SimpleNamespace(remote=self.remote)

    async def remote(self, segments: list[str], credential: str) -> dict:
        Host.calls.append((self.name, segments))
        delay = Host.delays.get(self.name, 0.0)
        await asyncio.sleep(3600 if delay is None else delay)
        return {s: {"role": "follower", "on": self.name} for s in segments}


def one_segment() -> dict[int, tuple[SegmentInfo, ReplicaSet]]:
    info = SegmentInfo.active(0, HashRange(start=0, end=MAX_HASH), 1)
    return {0: (info, ReplicaSet(1, ("d0", "d1", "d2")))}


def ask(monkeypatch: pytest.MonkeyPatch, delays: dict, endpoints: dict) -> tuple[object, float]:
    monkeypatch.setattr(replica_asks, "lookup", Host)
    Host.calls, Host.delays = [], delays
    nodes = {"d0": "n0", "d1": "n1", "d2": "n2"}
    started = time.monotonic()
    asked = asyncio.run(ask_replicas(TOPIC, one_segment(), nodes, endpoints))
    return asked, time.monotonic() - started


def test_a_silent_host_whose_data_plane_refuses_is_reported_dead_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked, took = ask(monkeypatch, {"host-n0": None}, {(0, "d0"): closed_port()})
    assert asked.refused == {(0, "d0")}
    assert took < replica_asks.STATUS_WAIT_S / 2  # not after the whole wait
    assert set(asked.statuses) == {(0, "d1"), (0, "d2")}  # the others answered


def test_a_silent_host_whose_data_plane_accepts_is_only_slow(
    monkeypatch: pytest.MonkeyPatch, listening: tuple[str, int]
) -> None:
    monkeypatch.setattr(replica_asks, "STATUS_WAIT_S", 0.5)
    asked, took = ask(monkeypatch, {"host-n0": None}, {(0, "d0"): listening})
    assert asked.refused == set() and (0, "d0") not in asked.statuses
    assert took >= 0.5  # waited for it to the end
    # slower than the probe, within the wait: its answer is taken
    asked, _ = ask(monkeypatch, {"host-n0": 0.3}, {(0, "d0"): listening})
    assert asked.refused == set() and asked.statuses[(0, "d0")]["on"] == "host-n0"
    # no address known (its data plane never listened): nothing to probe, it is waited for
    asked, took = ask(monkeypatch, {"host-n0": None}, {})
    assert asked.refused == set() and took >= 0.5


def test_a_probe_proves_only_a_refusal(listening: tuple[str, int]) -> None:
    assert asyncio.run(refuses(closed_port())) is True
    assert asyncio.run(refuses(listening)) is False


def test_a_round_asks_each_segment_host_once_for_all_its_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four segments of three replicas on nodes n0-n3 (disk dK on node nK): three hosts
    answer in three calls; a replica whose disk has no live node, or whose host does not
    answer in time, is missing (silent, as the rounds count it)."""
    monkeypatch.setattr(replica_asks, "lookup", Host)
    monkeypatch.setattr(replica_asks, "STATUS_WAIT_S", 0.2)
    Host.calls, Host.delays = [], {"host-n2": None}  # n2's host is stopped
    quarter = MAX_HASH // 4
    records = {
        i: (
            SegmentInfo.active(i, HashRange(start=i * quarter, end=i * quarter + 1), 1),
            ReplicaSet(1, tuple(f"d{(i + k) % 4}" for k in range(3))),
        )
        for i in range(4)
    }
    nodes = {"d0": "n0", "d1": "n1", "d2": "n2"}  # d3's node is gone
    found = asyncio.run(ask_replicas(TOPIC, records, nodes, {})).statuses
    assert sorted(host for host, _ in Host.calls) == ["host-n0", "host-n1", "host-n2"]
    assert all(len(segments) == 3 for _, segments in Host.calls)  # three replicas on each
    answered = {key for key, status in found.items() if status is not None}
    assert answered == {
        (i, f"d{(i + k) % 4}") for i in range(4) for k in range(3) if (i + k) % 4 in (0, 1)
    }
    assert found[(0, "d0")] == {"role": "follower", "on": "host-n0"}
