"""A segment's replicas serving (``actors.segment.replication`` and ``.following``): real
``Segment`` objects, each with a storage root of its own, in this process's event loop;
followers pull from their leader over its real data plane, and producers and readers are
raw sockets speaking ``runtime.wire``. What the controller will do (choose nodes, elect)
is done by hand here: the roles are what is tested."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from actors.segment import following, replication
from actors.segment.actor import Segment
from runtime import wire
from runtime.batch import make_batch, serialize_batch
from runtime.errors import NotEnoughReplicasError, NotLeaderError
from runtime.names import SegmentName
from storage.durability import Durability
from storage.replica_state import ReplicaStateFile
from storage.topic_storage import new_incarnation

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the catalog and guard read Ray's KV

FAST = {"policy": "none", "interval_s": 1.0}


class Replicas:
    """Replica ``r0``... of one segment, each a ``Segment`` on a root of its own."""

    def __init__(self, root: Path, count: int) -> None:
        self.name = SegmentName.parse(f"segment://repl/ns/t-{root.name[-8:]}/0000-ffff-0")
        incarnation = new_incarnation()
        self.segments = {
            f"r{i}": Segment(self.name, str(root / f"r{i}"), FAST, True, incarnation, f"r{i}")
            for i in range(count)
        }

    async def lead(self, leader: str, epoch: int, ack_quorum: int, timeout_s: float) -> None:
        """``leader`` leads ``epoch``; every other replica follows it."""
        segment = self.segments[leader]
        await segment.lead(epoch, len(self.segments), ack_quorum, timeout_s)
        endpoint = await segment.data_endpoint()
        for name, other in self.segments.items():
            if name != leader:
                await other.follow(epoch, endpoint)

    async def close(self) -> None:
        for segment in self.segments.values():
            await segment.close()


@asynccontextmanager
async def replicas(root: Path, count: int = 3) -> AsyncIterator[Replicas]:
    made = Replicas(root, count)
    try:
        yield made
    finally:
        await made.close()


class RawProducer:
    """A producer that is only a socket: a HELLO, then append frames, answers in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def to(cls, segment: Segment, access: int = wire.PRODUCE) -> RawProducer:
        endpoint = await segment.data_endpoint()
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_hello(None, access))
        producer = cls(reader, writer)
        wire.decode_welcome(await producer.answer())
        return producer

    def send(self, producer_id: str, sequence: int, values: list[bytes]) -> None:
        self.writer.write(
            wire.encode_append(producer_id, sequence, serialize_batch(make_batch(values)))
        )

    async def answer(self, timeout_s: float = 10.0) -> bytes:
        async def read() -> bytes:
            (length,) = wire.LENGTH.unpack(await self.reader.readexactly(wire.LENGTH.size))
            return await self.reader.readexactly(length)

        return await asyncio.wait_for(read(), timeout_s)

    def close(self) -> None:
        self.writer.close()


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def values(segment: Segment, offset: int = 0) -> list[bytes]:
    batch = await segment.read(offset, 1000)
    return batch.column("value").to_pylist()


async def stored(segment: Segment) -> list[Any]:
    """Everything the replica's log holds, committed or not (its files' view)."""
    log = segment._store.log
    return [(b.base_offset, b.producer_id, b.sequence, b.records.to_pylist())
            for b in log.read(log.start_offset, 10_000)] if log.end_offset else []  # fmt: skip


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_an_append_is_answered_once_the_quorum_holds_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, ack_quorum=2, timeout_s=10)
            producer = await RawProducer.to(three.segments["r0"])
            for sequence in range(5):
                producer.send("p", sequence, [f"m{sequence}".encode()] * 2)
            answers = [wire.decode_response(await producer.answer()) for _ in range(5)]
            assert answers == [(2 * i, 2) for i in range(5)]
            status = await three.segments["r0"].replica_status()
            assert status["role"] == "leader" and status["highWatermark"] == 10
            assert max(status["followers"].values()) == 10  # one follower at least held it
            await until(lambda: _ends(three, 10))  # both, soon after
            leader = await stored(three.segments["r0"])
            assert await stored(three.segments["r1"]) == leader
            assert await stored(three.segments["r2"]) == leader
            assert len(await values(three.segments["r0"])) == 10
            producer.close()

    run(scenario)


async def committed_on_r0(three: Replicas, value: bytes) -> RawProducer:
    """r0 leads epoch 1 (ack quorum 2, a 0.5 s commit time-out) and a first append of
    ``value`` is acknowledged: a producer connected to it."""
    await three.lead("r0", 1, ack_quorum=2, timeout_s=0.5)
    producer = await RawProducer.to(three.segments["r0"])
    producer.send("p", 0, [value])
    assert wire.decode_response(await producer.answer()) == (0, 1)
    return producer


async def _ends(three: Replicas, end: int) -> bool:
    return all(s._store.end_offset == end for s in three.segments.values())


def test_without_a_quorum_an_append_fails_naming_the_segment_and_no_reader_sees_it(
    tmp_path: Path,
) -> None:
    """Both followers stop: the append is stored on the leader but neither acknowledged
    nor read; the producer's retry after they are back is stored once and acknowledged."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            producer = await committed_on_r0(three, b"committed")
            leader = three.segments["r0"]
            for name in ("r1", "r2"):
                await three.segments[name]._roles.fence(2)  # they stop following
            producer.send("p", 1, [b"waits"])
            with pytest.raises(NotEnoughReplicasError, match=str(three.name)):
                wire.decode_response(await producer.answer())
            assert leader._store.end_offset == 2  # stored, not committed
            assert await values(leader) == [b"committed"]
            position = await leader.position()
            assert position["endOffset"] == 1  # what readers are told
            # A long-poll past the committed end waits, and returns nothing
            assert (await leader.read(1, 10, wait_s=0.2)).num_rows == 0
            # A new epoch: r0 leads again with its followers back; the retry is a duplicate
            await three.lead("r0", 3, ack_quorum=2, timeout_s=10)
            producer.close()
            producer = await RawProducer.to(leader)
            producer.send("p", 1, [b"waits"])
            assert wire.decode_response(await producer.answer()) == (1, 1)
            assert await values(leader) == [b"committed", b"waits"]
            producer.close()

    run(scenario)


def test_each_waiting_append_fails_at_its_own_time_out(tmp_path: Path) -> None:
    """Without a quorum, appends sent 0.3 s apart each hear ``NotEnoughReplicasError``
    once their own commit time-out (0.5 s) is over: not sooner, not much later."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            first = await committed_on_r0(three, b"committed")
            for name in ("r1", "r2"):
                await three.segments[name]._roles.fence(2)
            second = await RawProducer.to(three.segments["r0"])
            loop = asyncio.get_running_loop()

            async def failed_after(producer: RawProducer, sequence: int) -> float:
                sent = loop.time()
                producer.send("p" if producer is first else "q", sequence, [b"waits"])
                with pytest.raises(NotEnoughReplicasError):
                    wire.decode_response(await producer.answer())
                return loop.time() - sent

            early = asyncio.ensure_future(failed_after(first, 1))
            await asyncio.sleep(0.3)
            waited = [await failed_after(second, 0), await early]
            assert all(0.45 <= w <= 0.5 + 0.35 for w in waited), waited
            first.close()
            second.close()

    run(scenario)


def test_a_fenced_leader_acknowledges_nothing_and_serves_no_new_entry(tmp_path: Path) -> None:
    """An election fences r1 and r2 at epoch 2 behind r0's back (r0 is a stale leader that
    does not know): r0's appends are never acknowledged, and its readers never see them;
    r1 then leads, and r0, told to follow, drops the tail nobody committed."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            producer = await committed_on_r0(three, b"a")
            old = three.segments["r0"]
            await until(lambda: _ends(three, 1))
            for name in ("r1", "r2"):
                assert (await three.segments[name].fence(2))["end"] == 1
            producer.send("p", 1, [b"lost"])
            with pytest.raises(NotEnoughReplicasError):
                wire.decode_response(await producer.answer())
            assert await values(old) == [b"a"]
            producer.close()
            # r1 leads epoch 2; r0 learns it and follows
            new = three.segments["r1"]
            await new.lead(2, 3, 2, 10)
            endpoint = await new.data_endpoint()
            for name in ("r0", "r2"):
                await three.segments[name].follow(2, endpoint)
            producer = await RawProducer.to(new)
            producer.send("p", 1, [b"b"])
            assert wire.decode_response(await producer.answer()) == (1, 1)
            await until(lambda: _ends(three, 2))
            assert await stored(old) == await stored(new)
            assert [entry[3][0]["value"] for entry in await stored(old)] == [b"a", b"b"]
            producer.close()

    run(scenario)


def test_followers_serve_no_producer_and_no_reader(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with replicas(tmp_path, count=2) as two:
            await two.lead("r0", 1, ack_quorum=2, timeout_s=10)
            follower = two.segments["r1"]
            with pytest.raises(NotLeaderError, match="follows the leader"):
                await follower.read(0, 10)
            with pytest.raises(NotLeaderError):
                await follower.append(make_batch([b"x"]))
            endpoint = await follower.data_endpoint()
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(wire.encode_hello(None, wire.PRODUCE))
            (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
            with pytest.raises(NotLeaderError):
                wire.decode_welcome(await reader.readexactly(length))
            writer.close()
            # the leader's Ray-call append waits for the quorum too
            assert await two.segments["r0"].append(make_batch([b"y"] * 3)) == (0, 3)
            assert follower._store.end_offset == 3

    run(scenario)


def test_cursors_and_acknowledgements_reach_the_followers(tmp_path: Path) -> None:
    """A subscription created, acknowledged cumulatively and individually on the leader is
    held by every follower soon after, as it stands on the leader."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, ack_quorum=2, timeout_s=10)
            leader = three.segments["r0"]
            await leader.append(make_batch([b"m"] * 10))
            await leader.create_subscription("s")
            await leader.create_subscription("gone")
            await leader.ack_cumulative("s", 4)
            await leader.delete_subscription("gone")
            leader._store.ack("s", [7])

            async def held() -> bool:
                wanted = leader._store.cursors.snapshot()
                return all(
                    three.segments[name]._store.cursors.snapshot() == wanted
                    for name in ("r1", "r2")
                )

            await until(held)
            follower = three.segments["r1"]._store.cursors
            assert follower.names() == ["s"] and follower.get("s").mark_delete == 5
            assert follower.get("s").acked_ranges == ((7, 8),)
            # while no entry arrives (the followers' fetches wait at the leader), an
            # acknowledgement reaches them within a second all the same
            await asyncio.sleep(0.5)
            await leader.ack_cumulative("s", 8)
            await until(held, timeout_s=1.0)
            assert follower.get("s").mark_delete == 9

    run(scenario)


def test_a_sealed_leaders_followers_seal_at_its_end(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, ack_quorum=2, timeout_s=10)
            leader = three.segments["r0"]
            assert await leader.append(make_batch([b"m"] * 5)) == (0, 5)
            assert await leader.terminate() == 5
            # Answered once the ack quorum holds the seal: a follower's copy is sealed now
            assert any(three.segments[n]._store.terminated for n in ("r1", "r2"))

            await until(lambda: _all_sealed(three))
            assert {s._store.end_offset for s in three.segments.values()} == {5}
            position = await leader.position()
            assert position["terminated"] and position["endOffset"] == 5

    run(scenario)


def test_a_change_that_reaches_a_follower_is_refused_and_the_leaders_stands(
    tmp_path: Path,
) -> None:
    """The controller's changes sent where the directory named the leader a moment ago (an
    election made it a follower since): a split's seal, a subscription made, reset or
    deleted. Each is refused and changes nothing there, and the follower goes on copying;
    the seal sent again to the leader seals every replica at the same end."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, ack_quorum=2, timeout_s=10)
            leader, follower = three.segments["r0"], three.segments["r1"]
            assert await leader.append(make_batch([b"m"] * 5)) == (0, 5)
            await leader.create_subscription("s")
            await until(lambda: _holds(follower, ["s"]))
            changes = (
                follower.terminate(),
                follower.create_subscription("new"),
                follower.seek("s", "latest"),
                follower.delete_subscription("s"),
            )
            for change in changes:
                with pytest.raises(NotLeaderError, match="follows the leader"):
                    await change
            assert not follower._store.terminated
            assert follower._store.cursors.names() == ["s"]
            assert follower._store.cursors.get("s").mark_delete == 0
            assert await leader.append(make_batch([b"n"] * 3)) == (5, 3)

            async def copied() -> bool:
                return all(s._store.end_offset == 8 for s in three.segments.values())

            await until(copied)
            assert await leader.terminate() == 8

            await until(lambda: _all_sealed(three))

    run(scenario)


async def _holds(segment: Segment, subscriptions: list[str]) -> bool:
    return segment._store.cursors.names() == subscriptions


async def _all_sealed(replicas: Replicas) -> bool:
    return all(s._store.terminated for s in replicas.segments.values())


def test_a_seal_no_quorum_holds_fails_naming_the_segment_and_is_asked_again(
    tmp_path: Path,
) -> None:
    """Both followers stop following: the leader's seal stands (no append is taken), but
    ``terminate`` says within its commit time-out that no quorum holds it; asked again once
    a new epoch has followers, it answers."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, ack_quorum=2, timeout_s=0.5)
            leader = three.segments["r0"]
            assert await leader.append(make_batch([b"m"] * 3)) == (0, 3)
            for name in ("r1", "r2"):
                await three.segments[name]._roles.fence(2)
            with pytest.raises(NotEnoughReplicasError, match=f"{three.name}: sealed at offset 3"):
                await leader.terminate()
            assert leader._store.terminated
            await three.lead("r0", 3, ack_quorum=2, timeout_s=10)
            assert await leader.terminate() == 3
            assert any(three.segments[n]._store.terminated for n in ("r1", "r2"))

    run(scenario)


def test_an_unreplicated_segment_serves_as_before(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with replicas(tmp_path, count=1) as one:
            segment = one.segments["r0"]
            producer = await RawProducer.to(segment)
            producer.send("p", 0, [b"plain"])
            assert wire.decode_response(await producer.answer()) == (0, 1)
            assert (await segment.replica_status())["role"] == "none"
            assert await values(segment) == [b"plain"]
            producer.close()

    run(scenario)


def test_a_replica_laid_out_as_one_serves_nobody_until_it_is_given_a_role(tmp_path: Path) -> None:
    """A new replica, or one whose host restarted, may not lead: its log may lack a tail
    its followers hold. It refuses producers and readers until the controller says."""

    async def scenario() -> None:
        name = SegmentName.parse("segment://repl/ns/laid-out/0000-ffff-0")
        incarnation, root = new_incarnation(), str(tmp_path / "r0")
        first = Segment(name, root, FAST, True, incarnation, "r0")
        ReplicaStateFile(first._store.directory, Durability("none")).mark_replicated()
        await first.close()
        segment = Segment(name, root, FAST, False, incarnation, "r0")
        try:
            with pytest.raises(NotLeaderError, match="waits for its controller"):
                await segment.append(make_batch([b"x"]))
            with pytest.raises(NotLeaderError):
                await RawProducer.to(segment)
            assert (await segment.replica_status())["role"] == "none"  # the controller asks
            await segment.lead(1, 1, 1, 10.0)
            assert await segment.append(make_batch([b"y"])) == (0, 1)
            await segment.fence(2)  # an election: until it says, nobody is served again
            with pytest.raises(NotLeaderError, match="waits for its controller"):
                await segment.read(0, 10)
        finally:
            await segment.close()

    run(scenario)


def test_followers_tell_the_controller_once_their_leader_stops_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader's data plane closed under its followers (its process gone): each tells its
    controller, so the next replica round comes at once, at most every ``TELL_EVERY_S``;
    the leader reports where its data plane listens, which the controller probes."""
    told: list[tuple[str, float]] = []

    async def leader_unreachable(name: SegmentName, credential: str | None) -> None:
        told.append((str(name), asyncio.get_running_loop().time()))

    monkeypatch.setattr(replication, "leader_unreachable", leader_unreachable)
    monkeypatch.setattr(following, "TELL_EVERY_S", 0.5)

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            await three.lead("r0", 1, 2, 10.0)
            leader = three.segments["r0"]
            endpoint = await leader.data_endpoint()
            assert (await leader.replica_status())["endpoint"] == [endpoint.host, endpoint.port]
            await asyncio.sleep(0.3)
            assert told == []  # following quietly
            leader._data_plane.stop()  # refused from now on, its connections dropped
            await until(lambda: _true(len(told) >= 2), 5)
            assert {name for name, _ in told} == {str(three.name)}
            await asyncio.sleep(1.1)
            # two followers, each at most once per 0.5 s (their retries are more frequent)
            assert 4 <= len(told) <= 2 * (1 + 1.1 / 0.5) + 2, told

    run(scenario)


async def _true(value: bool) -> bool:
    return value


def test_a_leader_handing_over_waits_for_its_follower_then_both_are_equally_up_to_date(
    tmp_path: Path,
) -> None:
    """A lead moved off the controller's node: r0 stops taking appends (its producer is
    sent away, a new one refused), keeps shipping to r1 until r1 holds its whole log,
    and an election then finds them alike; a follower that never catches up makes the
    hand-over fail, and the leader takes appends again."""

    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            producer = await committed_on_r0(three, b"a")
            old = three.segments["r0"]
            producer.send("p", 1, [b"b"] * 50)
            await until(lambda: _true(old._store.end_offset == 51))  # stored, maybe not copied
            assert await old.hand_over("r1", 5.0) is True
            assert await old.data_endpoint()  # still listening, for its followers
            with pytest.raises(NotLeaderError, match="hands its lead over"):
                await RawProducer.to(old)
            with pytest.raises(NotLeaderError):
                await old.append(make_batch([b"late"]))
            reports = {name: await s.fence(2) for name, s in three.segments.items()}
            assert reports["r1"]["end"] == reports["r0"]["end"] == 51
            assert reports["r1"]["lastEpoch"] == reports["r0"]["lastEpoch"]
            producer.close()

    run(scenario)


def test_a_hand_over_to_a_follower_that_does_not_catch_up_fails_and_appends_resume(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with replicas(tmp_path) as three:
            producer = await committed_on_r0(three, b"a")
            await three.segments["r2"].fence(2)  # r2 stops following
            producer.send("p", 1, [b"b"])
            assert wire.decode_response(await producer.answer()) == (1, 1)  # r1 holds it
            old = three.segments["r0"]
            assert await old.hand_over("r2", 0.3) is False
            again = await RawProducer.to(old)  # taken again
            again.send("q", 0, [b"c"])
            assert wire.decode_response(await again.answer()) == (2, 1)
            again.close()
            producer.close()

    run(scenario)
