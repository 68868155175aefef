"""The frames between replicas (``runtime.replica_frames``): what is encoded decodes to
itself, and bytes from a peer that lies decode to ``InvalidArgumentError`` or to a
fetch and shipment that keep the rules, never to anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import wire
from runtime.errors import InvalidArgumentError, ScalableTopicsError, StaleEpochError
from runtime.replica_frames import decode_fetch, decode_shipment, encode_fetch, encode_shipment
from runtime.replication import EpochHistory, Fetch, Replication, Shipment
from storage.durability import Durability
from storage.replica_log import FollowerReplica, LeaderReplica
from storage.replica_state import ReplicaStateFile
from storage.segment_log import SegmentLog
from tests.test_replica_copies import fill

FAST = Durability("none")


def body(frame: bytes | list) -> bytes:
    data = b"".join(frame) if isinstance(frame, list) else frame
    (length,) = wire.LENGTH.unpack_from(data)
    assert length == len(data) - wire.LENGTH.size
    return data[wire.LENGTH.size :]


@st.composite
def histories(draw: st.DrawFn) -> EpochHistory:
    history = EpochHistory()
    epoch = offset = 0
    for _ in range(draw(st.integers(0, 5))):
        epoch += draw(st.integers(1, 3))
        offset += draw(st.integers(0, 50))
        history = history.begin(epoch, offset)
    return history


@given(
    replica=st.text(min_size=1, max_size=40),
    epochs=st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)).map(sorted),
    offset=st.integers(0, 2**62),
    max_bytes=st.integers(1, 64 << 20),
    wait_ms=st.integers(0, 60_000),
    version=st.integers(0, 2**60),
    sealed=st.booleans(),
)
def test_a_fetch_decodes_to_itself(
    replica: str,
    epochs: list[int],
    offset: int,
    max_bytes: int,
    wait_ms: int,
    version: int,
    sealed: bool,
) -> None:
    adopted, seen = epochs
    fetch = Fetch(replica, seen, adopted, offset, max_bytes, wait_ms / 1000, version, sealed)
    assert decode_fetch(body(encode_fetch(fetch))) == fetch


@given(
    history=histories(),
    data=st.binary(max_size=300),
    extra=st.integers(0, 9),
    cursors=st.binary(max_size=100),
    version=st.integers(0, 2**60),
)
def test_a_shipment_decodes_to_itself(
    history: EpochHistory, data: bytes, extra: int, cursors: bytes, version: int
) -> None:
    epoch = history.last_epoch + extra
    sealed = extra > 4
    shipment = Shipment(epoch, history, 3, 90, 40, 7, data, version, cursors, sealed)
    decoded = decode_shipment(body(encode_shipment(shipment)))
    assert decoded == Shipment(
        epoch, history, 3, 90, 40, 7, memoryview(data), version, memoryview(cursors), sealed
    )


@settings(max_examples=300)
@given(st.binary(max_size=120))
def test_garbage_is_a_typed_error_or_a_fetch_that_keeps_the_rules(garbage: bytes) -> None:
    for decode in (decode_fetch, decode_shipment):
        try:
            decoded = decode(garbage)
        except ScalableTopicsError:
            continue
        if isinstance(decoded, Fetch):
            assert 0 <= decoded.adopted_epoch <= decoded.seen_epoch and decoded.offset >= 0
        else:
            assert decoded.start <= decoded.end and decoded.high_watermark <= decoded.end
            assert decoded.history.last_epoch <= decoded.epoch


def _shipment_bytes(**changes: int) -> bytes:
    fields = {"epoch": 4, "start": 0, "end": 10, "high_watermark": 5, "offset": 2}
    fields.update(changes)
    history = EpochHistory().begin(1, 0).begin(3, 6)
    shipment = Shipment(fields.pop("epoch"), history, **fields, frames=b"")
    return body(encode_shipment(shipment))


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        (lambda: _shipment_bytes(high_watermark=11), "breaks the log's order"),
        (lambda: _shipment_bytes(start=11), "breaks the log's order"),
        (lambda: _shipment_bytes(epoch=2), "history up to epoch 3"),
        (lambda: _shipment_bytes()[:60], "too short for its epoch history"),
        (lambda: _shipment_bytes()[:20], "too short"),
        # epochs that do not rise: the second start's epoch overwritten with the first's
        (
            lambda: (
                b := bytearray(_shipment_bytes()),
                b.__setitem__(slice(72, 80), b[56:64]),
                bytes(b),
            )[-1],
            "breaks its rules",
        ),  # fmt: skip
        (lambda: body(encode_fetch(Fetch("r", 1, 2, 0))), "not after the seen one"),
        (lambda: body(encode_fetch(Fetch("r", 1, 1, 0)))[:-1], "name does not fit"),
        (lambda: body(encode_fetch(Fetch("r", 1, 1, 0))) + b"x", "name does not fit"),
        (  # the flags byte, just before the name's length, with a bit nobody defined
            lambda: (
                b := bytearray(body(encode_fetch(Fetch("r", 1, 1, 0)))),
                b.__setitem__(-4, 0x82),
                bytes(b),
            )[-1],
            "unknown flags 0x82",
        ),  # fmt: skip
        (
            lambda: bytes([wire.OP_READ]) + body(encode_fetch(Fetch("r", 1, 1, 0)))[1:],
            "unknown data plane operation",
        ),  # fmt: skip
    ],
)
def test_frames_that_lie_are_refused_saying_why(lie, message: str) -> None:  # noqa: ANN001
    data = lie()
    decode = decode_fetch if data[0] in (wire.OP_REPLICA_FETCH, wire.OP_READ) else decode_shipment
    if data[0] == wire.STATUS_OK and len(data) > 1 and decode is decode_fetch:
        decode = decode_shipment
    with pytest.raises(InvalidArgumentError, match=message):
        decode(data)


def test_a_leaders_error_reaches_the_follower_as_itself() -> None:
    error = StaleEpochError("this leader is fenced")
    with pytest.raises(StaleEpochError, match="fenced"):
        decode_shipment(body(wire.encode_error(error)))


def test_a_follower_stores_a_shipment_that_crossed_the_wire(tmp_path: Path) -> None:
    leader_log = SegmentLog(tmp_path / "r0", durability=FAST)
    follower_log = SegmentLog(tmp_path / "r1", durability=FAST)
    leader = LeaderReplica(
        "r0", leader_log, ReplicaStateFile(tmp_path / "r0", FAST), Replication.of(2), 1
    )
    follower = FollowerReplica("r1", follower_log, ReplicaStateFile(tmp_path / "r1", FAST))
    fill(leader_log, [3, 2, 4])
    leader.appended()
    for _ in range(2):
        fetch = decode_fetch(body(encode_fetch(follower.fetch())))
        shipment = decode_shipment(body(encode_shipment(leader.ship(fetch))))
        follower.receive(shipment)
    assert follower_log.end_offset == 9 and leader.hw == 9
    # One flipped byte in a stored frame: the follower stores nothing of the shipment
    fill(leader_log, [2], producer=None)
    wire_bytes = bytearray(body(encode_shipment(leader.ship(follower.fetch()))))
    wire_bytes[-3] ^= 0xFF
    with pytest.raises(ScalableTopicsError):
        follower.receive(decode_shipment(bytes(wire_bytes)))
    assert follower_log.end_offset == 9
