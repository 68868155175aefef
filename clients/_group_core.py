"""The machinery shared by stream and checkpoint consumers.

A consumer registers with its subscription's coordinator, long-polls for its
assignment (the poll is also its heartbeat), and runs one reader per assigned
segment that long-polls the segment and feeds a bounded local queue, so each
segment's messages reach the application in offset order.

When a segment is taken away, its reader stops, queued-but-undelivered
messages of it are dropped (they are unacknowledged, so the next owner reads
them), and the segment is released only once everything delivered from it is
acknowledged (or a timeout passes): a rebalance does not duplicate messages.
When a sealed segment is read and acknowledged to its end, the consumer
reports it finished, which is what lets the coordinator hand out its children.

A stream subscription with more consumers than readable segments shares segments by
key bucket (``runtime.assignment``): such a reader reads only its buckets, and since
its offsets are not a prefix of the segment it acknowledges them one by one (a
``settle`` on a second connection) instead of cumulatively on its next read. The
segment skips what the subscription acknowledged, so the next owner of a bucket
starts right after what its last owner acknowledged.

The coordinator and the segments are reached through a ``GroupAccess``: their actors
from a Ray driver, the REST gateway from a process outside Ray; the logic here is the
same over both. Every call carries the consumer's credential. A refusal (the token was
revoked, the grant withdrawn) is not retried: the application's next receive raises
it, after whatever had already arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from clients._data_plane import REFUSALS, ChannelError, ReadChannel
from clients._gc import freeze_what_exists
from clients._group_access import GroupAccess
from clients._inbox import Inbox
from clients._segment_reader import SegmentReader
from runtime import wire
from runtime.assignment import Share
from runtime.batch import following as read_following
from runtime.errors import (
    ConflictError,
    ConsumerNotRegisteredError,
    NotLeaderError,
    SegmentNotFoundError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    UnavailableError,
)
from runtime.names import SegmentName, TopicName, validate_part

log = logging.getLogger(__name__)
# The subscription, or its topic, was deleted: its coordinator holds nothing of this
# consumer any more, so there is nothing to leave or hand back, and nothing to read.
DELETED = (SubscriptionNotFoundError, TopicNotFoundError)
# How long a sealed segment's "finished" may be refused before it is worth a warning.
FINISH_QUIET_S = 5.0
# How long a consumer waits for a replicated segment's leader when it starts reading it
# (a new segment's first election, a failover): a few of the controller's rounds.
LEAD_WAIT_S = 60.0


@dataclass(frozen=True)
class ConsumerConfig:
    receiver_queue_size: int = 10_000
    read_batch: int = 5_000
    poll_timeout_s: float = 5.0
    release_timeout_s: float = 30.0
    ack_flush_s: float = 0.05


class GroupConsumerCore:
    """Loop-side state of one stream or checkpoint consumer."""

    def __init__(
        self,
        topic: TopicName,
        group: str,
        consumer: str,
        *,
        acknowledges: bool,
        config: ConsumerConfig,
        credential: str | None,
        access: GroupAccess,
        start_positions: dict[int, int] | None = None,
    ) -> None:
        self.topic = topic
        self.credential = credential
        self.group = validate_part("subscription", group)
        self.consumer = validate_part("consumer name", consumer)
        self.acknowledges = acknowledges
        self.config = config
        self.start_positions = dict(start_positions or {})
        self.access = access
        self.restarting = access.restarting
        self.readers: dict[int, SegmentReader] = {}
        self.finished: set[int] = set()
        # delivery batches, tagged with their reader; unpacked when the application takes them
        self.messages: Inbox[pa.RecordBatch] = Inbox()
        self.version = -1
        self.tasks: list[asyncio.Task] = []
        self.closed = False
        self.refused: Exception | None = None  # the cluster refused the credential

    async def start(self) -> None:
        try:
            await self._apply(await self._register())
        except BaseException:
            await self.access.close()
            raise
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._follow_assignment())]
        if self.acknowledges:
            self.tasks.append(loop.create_task(self._flush_acks_forever()))
        freeze_what_exists()

    # --- application side (called on the loop via the public wrappers) --------------

    def take(self, max_messages: int, timeout_s: float | None) -> list[tuple[int, pa.RecordBatch]]:
        """Up to ``max_messages`` for the application, as ``(segment id, delivery batch)``
        runs, waiting up to ``timeout_s`` for the first; ``[]`` on timeout. Any thread.
        Messages of a revoked segment are dropped: its next owner delivers them from the
        last acknowledged position."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            taken = self.messages.get_batches(max_messages, remaining)
            if not taken:
                return []
            runs = []
            for reader, run in taken:
                with reader.delivering:
                    if reader.revoked:
                        continue
                    reader.delivered = _after(run)
                    reader.step_over()
                    if reader.part:
                        reader.sent.append(run.column("offset").to_numpy())
                runs.append((reader.segment_id, run))
            if runs:
                return runs

    def fail(self, error: Exception) -> None:
        """Stop with ``error``: the application's receives raise it from now on."""
        if not self.closed:
            log.warning("%s/%s/%s: %s", self.topic, self.group, self.consumer, error)
        self.refused = error
        self.messages.fail(error)

    def acknowledge(self, segment_id: int, offset: int) -> None:
        reader = self.readers.get(segment_id)
        if reader is not None and offset + 1 > reader.acked:
            reader.acked = offset + 1
            reader.step_over()

    def positions(self) -> dict[int, int]:
        """Next offset to deliver, per segment this consumer holds."""
        return {sid: r.delivered for sid, r in self.readers.items()}

    async def close(self) -> None:
        """Graceful leave: flush the acknowledgements made, release every segment, then
        unregister so others rebalance now. Unlike a rebalance it waits for no further
        acknowledgement: the application that closes has none to make (as Kafka's and
        Pulsar's close), so what it left unacknowledged goes to the next owner."""
        self.closed = True
        for task in self.tasks:
            task.cancel()
        readers = list(self.readers.values())
        await asyncio.gather(*(self._give_up(r, wait_for_acks=False) for r in readers))
        with contextlib.suppress(*self.restarting, ConsumerNotRegisteredError, *DELETED, *REFUSALS):
            await self.access.unregister(self.consumer)
        await self.access.close()

    # --- assignment -------------------------------------------------------------------

    async def _register(self) -> dict[str, Any]:
        return await self.access.register(self.consumer)

    async def _follow_assignment(self) -> None:
        while not self.closed:
            try:
                poll_s = self.config.poll_timeout_s
                assignment = await self.access.poll(self.consumer, self.version, poll_s)
            except ConsumerNotRegisteredError:
                try:
                    assignment = await self._register()
                except (*REFUSALS, *DELETED) as err:
                    self.fail(err)
                    return
            except self.restarting:
                await asyncio.sleep(0.2)  # the coordinator is restarting
                continue
            except (*REFUSALS, *DELETED) as err:
                self.fail(err)
                return
            if assignment is not None:
                try:
                    await self._apply(assignment)
                except REFUSALS as err:
                    self.fail(err)
                    return
                except (SegmentNotFoundError, *self.restarting) as err:
                    # A segment's actor is gone until its controller brings it back.
                    # Forgetting the version makes the next poll hand the same
                    # assignment back at once, so the lookup is tried again.
                    who = f"{self.topic}/{self.group}/{self.consumer}"
                    log.warning("%s: assignment not taken up, retrying: %s", who, err)
                    self.version = -1
                    await asyncio.sleep(0.5)

    async def _apply(self, assignment: dict[str, Any]) -> None:
        self.version = assignment["version"]
        wanted = {s["segmentId"]: s for s in assignment["segments"]}
        for segment_id in [s for s in self.readers if s not in wanted]:
            asyncio.get_running_loop().create_task(self._give_up(self.readers[segment_id]))
        unread = [s for s in assignment.get("releasing", ()) if s not in self.readers]
        await asyncio.gather(*map(self._release_unread, unread))
        for segment_id, spec in wanted.items():
            if segment_id not in self.readers and segment_id not in self.finished:
                name = SegmentName.parse(spec["segmentTopic"])
                handle, position = await self._open_at(name, spec.get("startPosition"))
                buckets = spec.get("buckets")
                share = Share(segment_id, **buckets) if buckets else None
                reader = SegmentReader(name, handle, position, self.credential, share)
                self.readers[segment_id] = reader
                reader.task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _open_at(self, name: SegmentName, released: int | None) -> tuple[Any, int]:
        """The segment's handle and where to start reading it. A replicated segment whose
        leader is not chosen yet (just created) or moved, or whose host went with its
        node (placed again by its controller), is looked up again until one answers,
        for as long as ``LEAD_WAIT_S``."""
        deadline = time.monotonic() + LEAD_WAIT_S
        while True:
            handle = await self.access.find(name)
            try:
                return handle, await self._start_position(handle, name, released)
            except (NotLeaderError, *self.restarting):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _start_position(self, handle: Any, name: SegmentName, released: int | None) -> int:
        if self.acknowledges:
            return await self.access.position(handle, name)
        if name.segment_id in self.start_positions:
            return self.start_positions[name.segment_id]
        return released or 0

    # --- reading ----------------------------------------------------------------------

    async def _read(self, reader: SegmentReader) -> None:
        try:
            while not reader.revoked and not self.closed:
                if len(self.messages) >= self.config.receiver_queue_size:
                    await self.messages.wait_for_room(self.config.receiver_queue_size)
                    continue
                try:
                    batch, end_offset, terminated, following = await self._read_once(reader)
                except (*self.restarting, ChannelError, NotLeaderError):
                    await asyncio.sleep(0.2)  # the segment is restarting, or hibernated
                    if reader.revoked or self.closed:
                        # Given up while the read was out: nothing to reattach to, and
                        # after a close the program may have shut Ray down, where a
                        # lookup would make Ray join some cluster again.
                        return
                    await self._reattach(reader)
                    continue
                except SegmentNotFoundError as err:  # deleted, with its topic
                    if not (reader.revoked or self.closed):
                        log.warning("%s: stopped reading: %s", reader.name, err)
                    return
                except REFUSALS as err:
                    self.fail(err)
                    return
                after = reader.position
                if batch.num_rows:
                    self.messages.put(batch, reader)
                    after = reader.position = _after(batch)
                reader.read_up_to(after, following)
                if not batch.num_rows and terminated and reader.position >= end_offset:
                    reader.end = end_offset
                    await self._finish_when_settled(reader)
                    return
        except Exception as err:
            # Not foreseen: the consumer fails, saying why, rather than stall on this
            # segment for good (its children would never be read).
            log.exception("%s: reading segment %s stopped", self.topic, reader.segment_id)
            self.fail(err)
        finally:
            reader.channel.close()  # its acknowledgements' connection stays for the flushes

    async def _reattach(self, reader: SegmentReader) -> None:
        """A new handle and channel when the segment's actor was replaced
        (``find_segment_again``)."""
        try:
            handle = await self.access.find_again(reader.name)
        except REFUSALS as err:
            self.fail(err)
            return
        if handle is not None:
            reader.close()
            reader.channel = ReadChannel(
                handle, credential=self.credential,
                relocate=lambda: self.access.find_again(reader.name),
            )  # fmt: skip
            reader.settles = None

    async def _read_once(self, reader: SegmentReader) -> tuple[pa.RecordBatch, int, bool, int]:
        """One long-poll read, carrying (a whole segment's reader's) acknowledgements not
        yet sent, at most once per ``ack_flush_s``: the segment persists its cursor on
        every ack. A subscription's reader reads its share, what was acknowledged
        skipped, and learns where to read next; a checkpoint group's reads all."""
        now = time.monotonic()
        due = now - reader.ack_sent_at >= self.config.ack_flush_s
        ack = None
        if self.acknowledges and not reader.part and reader.acked > reader.flushed and due:
            ack, reader.ack_sent_at = reader.acked - 1, now
        reader.last_read_at = now
        if self.acknowledges:
            share = reader.share
            request = wire.ShareRead(
                reader.position, self.config.read_batch, 1.0, self.group, ack, *share[1:]
            )
            delivery = await reader.channel.read_share(request)
        else:
            request = wire.ReadRequest(
                reader.position, self.config.read_batch, 1.0, self.group, None
            )
            batch, end_offset, terminated = await reader.channel.read(request)
            delivery = (batch, end_offset, terminated, read_following(batch, reader.position))
        if ack is not None:
            reader.flushed = max(reader.flushed, ack + 1)
        return delivery

    async def _finish_when_settled(self, reader: SegmentReader) -> None:
        """Report a sealed segment finished once all of it is delivered (and acked).

        A segment ends (its reads say so) just before the split or merge that ended it
        commits the layout, so the coordinator may answer "not sealed" for a moment:
        retried quietly, and said only if it lasts."""
        refused_since: float | None = None
        while not reader.revoked and not self.closed:
            settled = reader.acked if self.acknowledges else reader.delivered
            if reader.part and settled >= reader.delivered:
                settled = reader.end  # all of its buckets it delivered, acknowledged
            if settled >= reader.end:
                await self._flush(reader)
                try:
                    await self.access.finished(self.consumer, reader.segment_id, settled)
                except REFUSALS as err:
                    self.fail(err)
                    return
                except (ConflictError, TimeoutError, UnavailableError, *self.restarting) as err:
                    # Not sealed yet, the coordinator restarting, or the segment not
                    # answering it (a replicated one's leader lost, say): asked again;
                    # given up, no other consumer would ever get its children. A run
                    # of a shared segment also waits for the other runs' consumers, as
                    # long as they take: no warning, and asked less often the longer
                    # it waits.
                    refused_since = refused_since or time.monotonic()
                    waited = time.monotonic() - refused_since
                    lasting = waited >= FINISH_QUIET_S and not reader.part
                    log.log(
                        logging.WARNING if lasting else logging.DEBUG,
                        "finishing segment %s: %s",
                        reader.segment_id,
                        err,
                    )
                    await asyncio.sleep(min(0.5 + waited / 10, 2.0) if reader.part else 0.5)
                    continue
                self.finished.add(reader.segment_id)
                self.readers.pop(reader.segment_id, None)
                reader.close()
                return
            await asyncio.sleep(0.01)

    async def _release_unread(self, segment_id: int) -> None:
        """A segment taken back that was never read here: nothing to acknowledge."""
        with contextlib.suppress(*self.restarting, ConsumerNotRegisteredError, *DELETED, *REFUSALS):
            await self.access.release(self.consumer, segment_id, None)

    async def _give_up(self, reader: SegmentReader, *, wait_for_acks: bool = True) -> None:
        """Stop reading, wait (on a rebalance) up to ``release_timeout_s`` for delivered
        messages to be acked, flush the acks, then release."""
        with reader.delivering:  # a run being handed out now counts as delivered
            reader.revoked = True
        if self.acknowledges:
            wait_s = self.config.release_timeout_s if wait_for_acks else 0.0
            deadline = time.monotonic() + wait_s
            while (
                reader.acked < reader.delivered
                and time.monotonic() < deadline
                and self.refused is None  # no ack would be taken
            ):
                await asyncio.sleep(0.01)
            await self._flush(reader)
        self.readers.pop(reader.segment_id, None)
        reader.close()
        position = None if self.acknowledges else reader.delivered
        with contextlib.suppress(*self.restarting, ConsumerNotRegisteredError, *DELETED, *REFUSALS):
            await self.access.release(self.consumer, reader.segment_id, position)

    # --- acknowledgements -------------------------------------------------------------

    async def _flush_acks_forever(self) -> None:
        """Acks ride on the next read. This sends those of segments that sent no read for
        ``ack_flush_s``: a long-poll on an idle segment, a segment read to its end, a
        full inbox. Backlogs stay true without an actor call per ack under load."""
        while True:
            await asyncio.sleep(self.config.ack_flush_s)
            since = time.monotonic() - self.config.ack_flush_s
            quiet = [r for r in self.readers.values() if r.part or r.last_read_at <= since]
            await asyncio.gather(*(self._flush(r) for r in quiet))

    async def _flush(self, reader: SegmentReader) -> None:
        if not self.acknowledges or reader.acked <= reader.flushed:
            return
        target = reader.acked
        try:
            if reader.part:
                await self._settle_part(reader, target)
            else:
                await self.access.ack_cumulative(reader.handle, reader.name, target - 1)
        except (*self.restarting, ChannelError, NotLeaderError):
            await self._reattach(reader)  # the ack is sent again by the next flush
            return
        except REFUSALS as err:
            self.fail(err)
            return
        reader.flushed = max(reader.flushed, target)

    async def _settle_part(self, reader: SegmentReader, target: int) -> None:
        """Acknowledge, one by one, the part's delivered offsets below ``target``; they
        are forgotten only once the segment took them."""
        taken = len(reader.sent)  # the application's thread may append meanwhile
        sent = np.concatenate(reader.sent[:taken]) if taken else np.zeros(0, np.int64)
        done = sent < target
        if done.any():
            offsets = sent[done].tolist()
            request = wire.SettleRequest(wire.Settle.ACK, self.group, self.consumer, offsets)
            await reader.settle_channel().settle(request)
        left = sent[~done]
        reader.sent[:taken] = [left] if len(left) else []


def _after(batch: pa.RecordBatch) -> int:
    """The offset that follows a delivery batch."""
    return batch.column("offset")[-1].as_py() + 1
