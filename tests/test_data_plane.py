"""The segment data plane: wire format, typed errors over TCP, reconnect and resend, the HELLO."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal

import pyarrow as pa
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.segment import data_plane
from actors.segment.actor import ACK_SAVE_PERIOD_S
from actors.segment.host import start_segment_actor
from clients import Producer, ScalableTopicsAdmin
from clients._data_plane import _WRITE_AHEAD, ChannelError, ReadChannel, SegmentChannel
from clients.message import messages_from_delivery
from runtime import wire
from runtime.batch import make_batch, serialize_batch
from runtime.errors import (
    InvalidArgumentError,
    SegmentTerminated,
    StaleEpochError,
    SubscriptionNotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from runtime.names import SegmentName
from storage.durability import Durability


def test_wire_round_trip_and_errors():
    payload = serialize_batch(make_batch([b"a", b"b"], ["k1", None]))
    frame = wire.encode_append("producer-1", 7, payload)
    (length,) = wire.LENGTH.unpack(frame[:4])
    producer, sequence, body = wire.decode_append(frame[4 : 4 + length])
    assert (producer, sequence, bytes(body)) == ("producer-1", 7, payload)
    assert wire.decode_append(wire.encode_append(None, None, b"x")[4:])[:2] == (None, None)
    ok = wire.encode_ok(40, 2)
    assert wire.decode_response(ok[4:]) == (40, 2)
    error = wire.encode_error(SegmentTerminated("segment 3 is terminated", 3))
    with pytest.raises(SegmentTerminated, match="terminated"):
        wire.decode_response(error[4:])
    with pytest.raises(StaleEpochError):
        wire.decode_response(wire.encode_error(StaleEpochError("old"))[4:])
    with pytest.raises(InvalidArgumentError):
        wire.decode_append(b"\x09\x00")
    request = wire.ReadRequest(12, 500, 1.5, "subscription-1", 11)
    frame = wire.encode_read(request)
    assert wire.decode_read(frame[4:]) == request
    assert wire.decode_read(wire.encode_read(request._replace(ack=None))[4:]).ack is None
    with pytest.raises(InvalidArgumentError, match="max records"):
        wire.decode_read(wire.encode_read(request._replace(max_records=0))[4:])
    records = wire.encode_records(99, True, (payload[:10], payload[10:]))
    end_offset, terminated, body = wire.decode_records(records[4:])
    assert (end_offset, terminated, bytes(body)) == (99, True, payload)
    with pytest.raises(SegmentTerminated):
        wire.decode_records(error[4:])


names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


def test_a_transaction_s_append_carries_its_id_and_a_plain_one_none() -> None:
    payload = serialize_batch(make_batch([b"a"]))
    frame = wire.encode_append("p", 3, payload, "txn-0a1b")
    assert wire.is_append(frame[4:])
    producer, sequence, txn, body = wire.decode_txn_append(frame[4:])
    assert (producer, sequence, txn, bytes(body)) == ("p", 3, "txn-0a1b", payload)
    assert wire.decode_append(frame[4:])[:2] == ("p", 3)
    assert wire.decode_txn_append(wire.encode_append("p", 3, payload)[4:])[2] is None
    header = frame[4 : 4 + 3 + 1 + 8]  # op, producer id length, "p", sequence
    for bad in (header, header + b"\x00" + payload, header + b"\x09txn"):
        with pytest.raises(InvalidArgumentError, match="transaction id"):
            wire.decode_txn_append(bad)
    with pytest.raises(InvalidArgumentError, match="1-255 bytes"):
        wire.encode_append("p", 3, payload, "t" * 256)


@settings(max_examples=200, deadline=None)
@given(
    subscription=names,
    consumer=names,
    max_records=st.integers(1, 2**32 - 1),
    wait_ms=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(list(wire.Settle)),
    offsets=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
)
def test_queue_frames_round_trip(subscription, consumer, max_records, wait_ms, kind, offsets):
    take = wire.TakeRequest(subscription, consumer, max_records, wait_ms / 1000)
    assert wire.decode_take(wire.encode_take(take)[4:]) == take
    settle = wire.SettleRequest(kind, subscription, consumer, offsets, wait_ms / 1000)
    assert wire.decode_settle(wire.encode_settle(settle)[4:]) == settle


@given(
    st.integers(0, 2**40),
    st.integers(1, 2**20),
    st.one_of(st.none(), st.integers(0, 2**40)),
    st.integers(0, 300),
    st.integers(1, 300),
    st.text(min_size=1, max_size=20),
)
def test_share_reads_round_trip(offset, max_records, ack, start, width, subscription):
    count = start + width + 1
    request = wire.ShareRead(
        offset, max_records, 1.5, subscription, ack, start, start + width, count
    )
    assert wire.decode_share_read(wire.encode_share_read(request)[4:]) == request
    answer = wire.encode_shared(9, True, 7, (b"",))[4:]
    assert wire.decode_shared(answer)[:3] == (9, True, 7)


def test_malformed_share_reads_are_typed_errors():
    """What a client that lies may send: a range outside its budget, an empty one, a
    short frame, a name cut off, a bad offset or size."""
    share = wire.encode_share_read(wire.ShareRead(5, 10, 1.0, "sub", None, 0, 2, 4))[4:]
    bad = [
        share[:10],
        wire.encode_share_read(wire.ShareRead(5, 10, 1.0, "sub", None, 3, 2, 4))[4:],
        wire.encode_share_read(wire.ShareRead(5, 10, 1.0, "sub", None, 0, 5, 4))[4:],
        share[:-2],
        bytes([wire.OP_SHARE_READ])
        + (2**63 - 1).to_bytes(8, "big", signed=True)[:0]
        + (-1).to_bytes(8, "big", signed=True)
        + share[9:],
        share[:9] + bytes(4) + share[13:],
        bytes([wire.OP_READ]) + share[1:],
    ]
    for frame in bad:
        with pytest.raises(InvalidArgumentError):
            wire.decode_share_read(frame)


def test_malformed_queue_frames_are_typed_errors():
    take = wire.encode_take(wire.TakeRequest("s", "c", 10, 1.0))[4:]
    settle = wire.encode_settle(wire.SettleRequest(wire.Settle.ACK, "s", "c", [1, 2]))[4:]
    bad = {
        "too short": [take[:5], settle[:5]],
        "max records": [take[:1] + bytes(4) + take[5:]],
        "unknown settle kind": [settle[:1] + bytes([9]) + settle[2:]],
        "names": [take[:9] + b"\x00\x09" + take[11:], settle[:-17]],
        "8-byte": [settle[:-3]],
        "UTF-8": [take[:-1] + b"\xff"],
        "operation": [bytes([wire.OP_READ]) + take[1:], bytes([wire.OP_APPEND]) + settle[1:]],
    }
    decoders = {wire.OP_QUEUE_TAKE: wire.decode_take, wire.OP_QUEUE_SETTLE: wire.decode_settle}
    for why, frames in bad.items():
        for frame in frames:
            decode = decoders.get(frame[0], wire.decode_take)
            with pytest.raises(InvalidArgumentError, match=why):
                decode(frame)
    records = wire.encode_records(7, True, (b"",), wire.DRAINED)[4:]
    assert wire.decode_taken(records)[:2] == (7, wire.TERMINATED | wire.DRAINED)
    assert wire.decode_records(records)[:2] == (7, True)


def read_request(offset: int, wait_s: float = 0.0, ack: int | None = None) -> wire.ReadRequest:
    return wire.ReadRequest(offset, 1_000, wait_s, "s", ack)


@pytest.fixture
def segment(ray_cluster, unique):
    name = SegmentName.parse(f"segment://wire/ns/t-{unique}/0000-ffff-0")
    handle = start_segment_actor(name, initialize=True, durability=Durability(policy="fsync"))
    ray.get(handle.create_subscription.remote("s"))
    yield handle
    ray.kill(handle.host, no_restart=True)


def test_appends_over_tcp_with_typed_errors(segment):
    async def scenario():
        channel = SegmentChannel(segment)
        batch = serialize_batch(make_batch([b"x"] * 10))
        assert await channel.append("p", 0, batch) == (0, 10)
        assert await channel.append("p", 0, batch) == (0, 10)  # a resend: same offsets
        assert await channel.append("p", 1, batch) == (10, 10)
        with pytest.raises(InvalidArgumentError, match="malformed"):
            await channel.append("p", 2, b"not arrow")
        await segment.terminate.remote()
        with pytest.raises(SegmentTerminated):
            await channel.append("p", 2, batch)
        await channel.close()

    asyncio.run(scenario())


def test_a_channel_hands_the_transport_a_bounded_write_ahead(segment):
    """Appends past ``_WRITE_AHEAD`` wait in the channel, not in the transport's buffer,
    and go out as answers come: every one is stored, in order."""
    payload = serialize_batch(make_batch([bytes(1000)] * 1000))  # ~1 MB

    async def scenario():
        channel = SegmentChannel(segment)
        await channel.append("big", 0, payload)  # connected
        tasks = [asyncio.ensure_future(channel.append("big", s, payload)) for s in range(1, 41)]
        await asyncio.sleep(0)
        buffered = channel._writer.transport.get_write_buffer_size()
        results = await asyncio.gather(*tasks)
        await channel.close()
        return buffered, results

    buffered, results = asyncio.run(scenario())
    assert buffered < _WRITE_AHEAD + len(payload) + 64
    assert [base for base, _ in results] == [s * 1000 for s in range(1, 41)]


def test_a_refused_sequence_does_not_hold_up_the_next(segment):
    """Sequence 1 is refused (not Arrow); sequence 2 must be stored at once, not wait
    30 s for a batch 1 that will never be stored."""

    async def scenario():
        channel = SegmentChannel(segment)
        batch = serialize_batch(make_batch([b"x"] * 10))
        assert await channel.append("r", 0, batch) == (0, 10)
        refused = asyncio.ensure_future(channel.append("r", 1, b"not arrow"))
        after = asyncio.ensure_future(channel.append("r", 2, batch))
        with pytest.raises(InvalidArgumentError, match="malformed"):
            await refused
        assert await asyncio.wait_for(after, timeout=5) == (10, 10)
        await channel.close()

    asyncio.run(scenario())


async def raw_connection(
    segment, access: int = wire.PRODUCE | wire.CONSUME
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain connection past the HELLO (authentication is off in these tests)."""
    endpoint = await segment.data_endpoint.remote()
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    writer.write(wire.encode_hello(None, access))
    (welcome,) = await _responses(reader, 1)
    assert wire.decode_welcome(welcome) == access
    return reader, writer


async def _responses(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
        bodies.append(await reader.readexactly(length))
    return bodies


def test_frames_of_one_read_are_stored_together_and_wait_for_their_turn(segment):
    """Several frames in one write: each gets its own response, a bad one does not stop
    the others, and frames that come before their predecessor (on another
    connection) wait for it and are then stored in sequence order."""
    batch = [serialize_batch(make_batch([f"{i}".encode()])) for i in range(5)]

    async def scenario():
        first = await raw_connection(segment)
        early = await raw_connection(segment)
        first[1].write(wire.encode_append("p", 0, batch[0]))
        assert [wire.decode_response(r) for r in await _responses(first[0], 1)] == [(0, 1)]
        early[1].write(
            b"".join(wire.encode_append("p", seq, batch[seq]) for seq in (2, 3))
            + wire.encode_append(None, None, b"not arrow")
            + wire.encode_append(None, None, batch[4])
        )
        await asyncio.sleep(0.3)  # the early frames park: nothing is answered yet
        assert (await segment.position.remote("s"))["endOffset"] == 1
        first[1].write(wire.encode_append("p", 1, batch[1]))
        assert [wire.decode_response(r) for r in await _responses(first[0], 1)] == [(1, 1)]
        responses = await _responses(early[0], 4)
        assert [wire.decode_response(r) for r in responses[:2]] == [(2, 1), (3, 1)]
        with pytest.raises(InvalidArgumentError, match="malformed"):
            wire.decode_response(responses[2])
        assert wire.decode_response(responses[3]) == (4, 1)
        for _, writer in (first, early):
            writer.close()

    asyncio.run(scenario())
    stored = ray.get(segment.read.remote(0, 10)).column("value").to_pylist()
    assert stored == [b"0", b"1", b"2", b"3", b"4"]


def test_channel_resends_in_order_across_a_segment_crash(segment):
    seed = int(os.environ.get("RAYTOPICS_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    rnd = random.Random(seed)
    batches = [
        serialize_batch(make_batch([f"{i * 100 + j}".encode() for j in range(100)]))
        for i in range(300)
    ]

    async def scenario():
        channel = SegmentChannel(segment)
        tasks = []
        kill_at = rnd.randrange(50, 250)
        for sequence, payload in enumerate(batches):
            tasks.append(asyncio.ensure_future(channel.append("crash", sequence, payload)))
            if sequence == kill_at:
                pid = (await segment.ready.remote())["pid"]
                os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0)
        results = await asyncio.gather(*tasks)
        await channel.close()
        return results

    results = asyncio.run(scenario())
    assert [base for base, _ in results] == [i * 100 for i in range(300)]
    values = []
    offset = 0
    while True:
        batch = ray.get(segment.read.remote(offset, 10_000))
        if batch.num_rows == 0:
            break
        values += [int(v) for v in batch.column("value").to_pylist()]
        offset += batch.num_rows
    assert values == list(range(30_000)), "every append stored exactly once, in order"


@pytest.mark.parametrize("transport", ["tcp", "ray"])
def test_producer_transports_agree(ray_cluster, unique, transport):
    admin = ScalableTopicsAdmin()
    topic = f"topic://wire/{transport}/t-{unique}"
    admin.create_scalable_topic(topic, 2)
    with Producer(topic, transport=transport) as producer:
        ids = producer.send_batch(
            [str(i).encode() for i in range(5_000)], [f"k{i}" for i in range(5_000)]
        )
        result = ids.result()
    assert len(set(zip(result.segment_ids, result.offsets, strict=True))) == 5_000
    stats = admin.get_stats(topic)
    assert stats["records"] == 5_000
    admin.delete_scalable_topic(topic)
    with pytest.raises(InvalidArgumentError, match="transport"):
        Producer(topic, transport="carrier-pigeon")


def test_reads_over_tcp_long_poll_carry_acks_and_report_the_end(segment):
    async def scenario():
        reader = ReadChannel(segment)
        producer = SegmentChannel(segment)
        await producer.append("p", 0, serialize_batch(make_batch([b"a", b"b", b"c"])))
        batch, end_offset, terminated = await reader.read(read_request(0))
        assert batch.column("value").to_pylist() == [b"a", b"b", b"c"]
        assert batch.column("offset").to_pylist() == [0, 1, 2]
        assert (end_offset, terminated) == (3, False)
        # A long-poll is answered as soon as records arrive, and its ack is applied first.
        waiting = asyncio.ensure_future(reader.read(read_request(3, wait_s=30, ack=1)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        assert (await segment.position.remote("s"))["position"] == 2
        await producer.append("p", 1, serialize_batch(make_batch([b"d"])))
        batch, end_offset, _ = await asyncio.wait_for(waiting, timeout=5)
        assert (batch.column("value").to_pylist(), end_offset) == ([b"d"], 4)
        # Nothing new: an empty batch after the wait, with the end and the termination.
        await segment.terminate.remote()
        batch, end_offset, terminated = await reader.read(read_request(4, wait_s=0.2, ack=3))
        assert (batch.num_rows, end_offset, terminated) == (0, 4, True)
        assert (await segment.position.remote("s"))["drained"]
        with pytest.raises(SubscriptionNotFoundError):
            await reader.read(read_request(0, ack=0)._replace(subscription="nobody"))
        await producer.close()
        reader.close()

    asyncio.run(scenario())


def test_an_ack_on_a_read_is_saved_within_the_saver_s_period(ray_cluster, unique):
    """Under ``interval`` durability a read's ack reaches the disk at most
    ``ACK_SAVE_PERIOD_S`` later (``storage.cursors.CursorStore``): a crash after that
    restarts the segment with it."""
    name = SegmentName.parse(f"segment://wire/ns/t-{unique}/0000-ffff-0")
    handle = start_segment_actor(name, initialize=True, durability=Durability("interval"))
    ray.get(handle.create_subscription.remote("s"))

    async def scenario():
        reader, producer = ReadChannel(handle), SegmentChannel(handle)
        await producer.append("p", 0, serialize_batch(make_batch([b"x"] * 5)))
        await reader.read(read_request(0))
        await reader.read(read_request(5, ack=3))
        assert (await handle.position.remote("s"))["position"] == 4  # in memory at once
        await asyncio.sleep(ACK_SAVE_PERIOD_S + 0.5)
        os.kill((await handle.ready.remote())["pid"], signal.SIGKILL)
        await producer.close()
        reader.close()

    try:
        asyncio.run(scenario())
        assert ray.get(handle.position.remote("s"), timeout=60)["position"] == 4
    finally:
        ray.kill(handle.host, no_restart=True)


def test_reads_and_appends_share_a_connection_in_order(segment):
    """An append, a read and another append in one write: answered in that order, and
    the read sees the first append only."""
    payloads = [serialize_batch(make_batch([v])) for v in (b"one", b"two")]

    async def scenario():
        reader, writer = await raw_connection(segment)
        writer.write(
            wire.encode_append("p", 0, payloads[0])
            + wire.encode_read(read_request(0))
            + wire.encode_append("p", 1, payloads[1])
        )
        first, read, second = await _responses(reader, 3)
        writer.close()
        return wire.decode_response(first), wire.decode_records(read), wire.decode_response(second)

    first, (end_offset, _, stream), second = asyncio.run(scenario())
    assert (first, second) == ((0, 1), (1, 1))
    assert end_offset == 1
    assert pa.ipc.open_stream(pa.py_buffer(stream)).read_all().num_rows == 1


def test_a_read_channel_reconnects_after_a_segment_crash(segment):
    async def scenario():
        reader = ReadChannel(segment)
        producer = SegmentChannel(segment)
        await producer.append("p", 0, serialize_batch(make_batch([b"x"] * 5)))
        assert (await reader.read(read_request(0)))[0].num_rows == 5
        waiting = asyncio.ensure_future(reader.read(read_request(5, wait_s=30)))
        await asyncio.sleep(0.2)
        os.kill((await segment.ready.remote())["pid"], signal.SIGKILL)
        with pytest.raises(ChannelError):
            await asyncio.wait_for(waiting, timeout=10)
        batch, end_offset, _ = await reader.read(read_request(0))  # the restarted segment
        assert (batch.num_rows, end_offset) == (5, 5)
        await producer.close()
        reader.close()

    asyncio.run(scenario())


def test_queue_consumers_take_and_settle_over_tcp(segment):
    """Two queue consumers take different messages; an acknowledged one is not delivered
    again, a handed-back one comes back (counted), a departing consumer's come back at
    once; a sealed segment says it is drained once all of it is acknowledged. A settle on
    a connection granted produce only is refused, and a malformed or empty frame is
    answered as malformed without closing the connection."""

    def take(consumer: str, wait_s: float = 0.0) -> wire.TakeRequest:
        return wire.TakeRequest("s", consumer, 3, wait_s)

    def settle(kind: wire.Settle, consumer: str, *offsets: int, delay_s: float = 0.0):
        return wire.SettleRequest(kind, "s", consumer, list(offsets), delay_s)

    def offsets(batch: pa.RecordBatch) -> list[int]:
        return batch.column("offset").to_pylist()

    async def scenario():
        a, b, settles = ReadChannel(segment), ReadChannel(segment), ReadChannel(segment)
        producer = SegmentChannel(segment)
        await producer.append("p", 0, serialize_batch(make_batch([b"x"] * 5)))
        first, drained = await a.take(take("a"))
        assert (offsets(first), drained) == ([0, 1, 2], False)
        assert offsets((await b.take(take("b")))[0]) == [3, 4]
        waiting = asyncio.ensure_future(b.take(take("b", wait_s=30)))  # a long-poll
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await settles.settle(settle(wire.Settle.ACK, "a", 0, 2))
        await settles.settle(settle(wire.Settle.NEGATIVE_ACK, "a", 1))  # wakes the poll
        again = (await asyncio.wait_for(waiting, timeout=5))[0]
        assert offsets(again) == [1]
        assert messages_from_delivery(0, again)[0].redelivery_count == 1
        await settles.settle(settle(wire.Settle.CONSUMER_LEFT, "b"))
        assert offsets((await a.take(take("a")))[0]) == [1, 3, 4]
        await segment.terminate.remote()
        await settles.settle(settle(wire.Settle.ACK, "a", 1, 3))
        assert (await a.take(take("a", wait_s=5)))[1] is False  # 4 is still held
        await settles.settle(settle(wire.Settle.ACK, "a", 4))
        nothing, drained = await a.take(take("a", wait_s=5))  # sealed: no wait
        assert (nothing.num_rows, drained) == (0, True)
        with pytest.raises(InvalidArgumentError, match="between 0 and"):
            await settles.settle(settle(wire.Settle.NEGATIVE_ACK, "a", 4, delay_s=10**6))
        with pytest.raises(SubscriptionNotFoundError):
            await a.take(take("a")._replace(subscription="nobody"))
        reader, writer = await raw_connection(segment)
        writer.write(wire.LENGTH.pack(0))  # an empty frame
        writer.write(wire.LENGTH.pack(3) + bytes([wire.OP_QUEUE_TAKE, 0, 0]))
        writer.write(wire.encode_take(take("c")))
        empty, malformed, answered = await _responses(reader, 3)
        writer.close()
        produce_only, writer = await raw_connection(segment, wire.PRODUCE)
        writer.write(wire.encode_settle(settle(wire.Settle.ACK, "c", 0)))
        (refused,) = await _responses(produce_only, 1)
        assert await produce_only.read() == b"", "the segment closes the connection"
        writer.close()
        for channel in (a, b, settles):
            channel.close()
        await producer.close()
        return empty, malformed, answered, refused

    empty, malformed, answered, refused = asyncio.run(scenario())
    for answer in (empty, malformed):
        with pytest.raises(InvalidArgumentError, match="too short"):
            wire.decode_taken(answer)
    assert wire.decode_taken(answered)[1] == wire.TERMINATED | wire.DRAINED
    with pytest.raises(UnauthorizedError, match="granted produce only, not consume"):
        wire.decode_response(refused)


def test_hello_frames_round_trip_and_refuse_what_is_not_one():
    frame = wire.encode_hello("a-token", wire.PRODUCE | wire.CONSUME)
    assert wire.decode_hello(frame[4:]) == ("a-token", 3)
    assert wire.decode_hello(wire.encode_hello(None, wire.CONSUME)[4:]) == (None, 2)
    assert wire.decode_welcome(wire.encode_welcome(wire.PRODUCE)[4:]) == wire.PRODUCE
    append = wire.encode_append("p", 0, b"x")[4:]
    with pytest.raises(UnauthenticatedError, match="HELLO"):
        wire.decode_hello(append)
    with pytest.raises(InvalidArgumentError, match="version"):
        wire.decode_hello(bytes([wire.OP_HELLO, 99, 1]))
    for access in (0, 8, 255):
        with pytest.raises(InvalidArgumentError, match="access"):
            wire.decode_hello(bytes([wire.OP_HELLO, wire.WIRE_VERSION, access]))
    with pytest.raises(UnauthenticatedError):
        wire.decode_hello(bytes([wire.OP_HELLO, wire.WIRE_VERSION, 1]) + b"\xff\xfe")
    with pytest.raises(InvalidArgumentError, match="credential"):
        wire.encode_hello("x" * (wire.MAX_CREDENTIAL + 1), wire.PRODUCE)
    refusal = wire.encode_error(UnauthorizedError("no"))[4:]
    with pytest.raises(UnauthorizedError):
        wire.decode_welcome(refusal)
    assert wire.is_refusal(wire.decode_error(refusal))


def test_an_append_without_a_hello_is_refused_even_with_auth_off(segment):
    """The HELLO is part of the protocol, not of the policy: a bare append is never looked at."""

    async def scenario():
        endpoint = await segment.data_endpoint.remote()
        assert not endpoint.tls
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_append("p", 0, serialize_batch(make_batch([b"sneaked"]))))
        (refusal,) = await _responses(reader, 1)
        assert await reader.read() == b"", "the segment closes the connection"
        writer.close()
        return refusal

    with pytest.raises(UnauthenticatedError, match="HELLO"):
        wire.decode_response(asyncio.run(scenario()))
    assert (ray.get(segment.position.remote("s")))["endOffset"] == 0


class _Policy:
    """A policy as the data plane sees it: who may have which access, and a version."""

    def __init__(self) -> None:
        self.version = 1
        self.grants = {"good-token": wire.PRODUCE | wire.CONSUME, "reader": wire.CONSUME}

    def authorize(self, credential: str | None, access: int) -> None:
        if credential not in self.grants:
            raise UnauthenticatedError("the presented token is not valid")
        if access & ~self.grants[credential]:
            raise UnauthorizedError("not granted")


@pytest.fixture
def plane(monkeypatch):
    """A real data plane server on loopback, in this process, that stores frames in a list."""
    monkeypatch.setattr(data_plane, "HELLO_TIMEOUT_S", 0.3)
    monkeypatch.setattr(data_plane, "RECHECK_S", 0.05)
    policy, stored = _Policy(), []

    def handle_now(bodies):
        stored.extend(bytes(b) for b in bodies)
        return [wire.encode_ok(len(stored) - 1, 1) for _ in bodies]

    async def handle_later(body):
        raise AssertionError("nothing parks here")

    server = data_plane.DataPlaneServer(
        handle_now, handle_later, policy.authorize, data_plane.PolicyWatch(lambda: policy.version)
    )
    return server, policy, stored


def test_the_data_plane_admits_rechecks_and_times_out(plane):
    server, policy, stored = plane
    append = wire.encode_append(None, None, b"payload")

    async def scenario():
        endpoint = await server.start("127.0.0.1", None)
        connect = functools.partial(asyncio.open_connection, endpoint.host, endpoint.port)
        # Silent: closed once the HELLO is overdue.
        silent_reader, silent = await connect()
        (overdue,) = await _responses(silent_reader, 1)
        assert await silent_reader.read() == b""
        # A stranger announcing a huge first frame: refused at once, nothing buffered.
        huge_reader, huge = await connect()
        huge.write(wire.LENGTH.pack(wire.MAX_FRAME) + b"x" * 1000)
        (too_big,) = await _responses(huge_reader, 1)
        # Accepted, then revoked: the next version refuses the open connection.
        reader, writer = await connect()
        writer.write(wire.encode_hello("good-token", wire.PRODUCE) + append)
        welcome, appended = await _responses(reader, 2)
        assert wire.decode_welcome(welcome) == wire.PRODUCE
        assert wire.decode_response(appended) == (0, 1)
        del policy.grants["good-token"]
        policy.version += 1
        (revoked,) = await asyncio.wait_for(_responses(reader, 1), timeout=5)
        assert await reader.read() == b""
        writer.write(append)  # the segment stopped reading: never stored
        await asyncio.sleep(0.1)
        for w in (silent, huge, writer):
            w.close()
        return overdue, too_big, revoked

    overdue, too_big, revoked = asyncio.run(scenario())
    with pytest.raises(UnauthenticatedError, match="no data plane HELLO"):
        wire.decode_response(overdue)
    with pytest.raises(UnauthenticatedError, match="must be a HELLO"):
        wire.decode_response(too_big)
    with pytest.raises(UnauthenticatedError, match="not valid"):
        wire.decode_response(revoked)
    assert stored == [wire.encode_append(None, None, b"payload")[4:]]
    assert not server.connections


def test_one_policy_watch_rechecks_every_segment_of_a_process_and_rests_when_idle(monkeypatch):
    """A host's segments share one watch: one version change refuses the revoked token on
    every segment's connections, and once none is left open its loop ends."""
    monkeypatch.setattr(data_plane, "RECHECK_S", 0.05)
    policy, looked = _Policy(), []

    def version() -> int:
        looked.append(policy.version)
        return policy.version

    watch = data_plane.PolicyWatch(version)

    async def never(body):
        raise AssertionError("nothing parks here")

    servers = [
        data_plane.DataPlaneServer(lambda bodies: [], never, policy.authorize, watch)
        for _ in range(3)
    ]

    async def scenario():
        writers, readers = [], []
        for server in servers:
            endpoint = await server.start("127.0.0.1", None)
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(wire.encode_hello("good-token", wire.PRODUCE))
            (welcome,) = await _responses(reader, 1)
            assert wire.decode_welcome(welcome) == wire.PRODUCE
            readers.append(reader)
            writers.append(writer)
        assert watch._task is not None and not watch._task.done()
        looked.clear()
        await asyncio.sleep(0.5)
        rounds = len(looked)  # one look a round for all three segments, not three
        assert 3 <= rounds <= 12, rounds
        del policy.grants["good-token"]
        policy.version += 1
        revoked = [await asyncio.wait_for(_responses(r, 1), timeout=5) for r in readers]
        assert [await r.read() for r in readers] == [b""] * 3
        await asyncio.wait_for(watch._task, timeout=5)  # nobody connected: the loop ended
        for server in servers:
            server.stop()
        for writer in writers:
            writer.close()
        return revoked, rounds

    revoked, rounds = asyncio.run(scenario())
    for (body,) in revoked:
        with pytest.raises(UnauthenticatedError, match="not valid"):
            wire.decode_response(body)
