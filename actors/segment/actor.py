"""A segment served: one object per open segment, living in a segment host's process.

Async, so that consumers can long-poll (``read(..., wait_s)``) without occupying a
thread, while appends from many producers interleave. All rules live in
``storage.segment_store``; this shell adds waiting, timers and the data plane. Its
host (``actors.segment.host``) is a detached, restartable Ray actor that serves many
segments and routes each call to one; calls are retried by Ray across a restart of
the host (``max_task_retries=-1``): appends are idempotent per (producer id,
sequence), everything else is idempotent too.

Every method takes the caller's ``credential`` and checks it here, where the data
lives, against the cluster's policy (``actors.guard``) for the segment's
namespace: appends need ``produce``; reads, acknowledgements, queue receives and
a subscription's position need ``consume``; the data plane's address needs
``lookup`` (its connections then authenticate themselves, ``actors.segment.data_plane``);
everything the controller calls needs ``admin``, which the system's internal
credential has. With no stored policy every check passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.exceptions import ActorUnavailableError

from actors.guard import guard
from actors.metrics import SegmentMetrics
from actors.segment.appender import SegmentAppender
from actors.segment.data_plane import DataPlaneServer, PolicyWatch
from actors.segment.flusher import IntervalFlusher
from actors.segment.reader import SegmentReader
from actors.segment.replication import ReplicaRoles
from actors.segment.txn_calls import TransactionCalls
from actors.segment.txn_joins import TxnJoins, ask_for_sweep
from runtime import tls, wire
from runtime.auth import Permission
from runtime.batch import ipc_parts
from runtime.config import env_float
from runtime.errors import InvalidArgumentError, ScalableTopicsError, UnavailableError
from runtime.limits import LiveLimits
from runtime.listen import addresses, port_range
from runtime.names import SegmentName
from runtime.replication import Replication
from runtime.subscription import ResetTarget, reset_target
from storage.asleep import SleepingSegments
from storage.catalog import Catalog
from storage.cursors import Position
from storage.durability import Durability, node_storage_root, storage_scope
from storage.incarnation_storage import IncarnationStorage
from storage.placements import disk_id
from storage.replica_state import ReplicaStateFile
from storage.segment_store import SealedBy
from storage.tier import open_tier, tier_directory

# How long a queue consumer may hold a message unacknowledged before it goes to
# another: the time a crashed consumer's messages stay stuck.
ACK_TIMEOUT_ENV = "RAYTOPICS_ACK_TIMEOUT_S"
DEFAULT_ACK_TIMEOUT_S = 30.0
# How late a cumulative ack that rode on a read may reach the disk, unless durability is
# ``fsync`` (``storage.cursors.CursorStore`` says why): Pulsar's default mark-delete rate.
ACK_SAVE_PERIOD_S = 1.0
# The policy's version is looked at once for all of this process's segments.
_POLICY_WATCH = PolicyWatch(lambda: guard().version)


class Segment(TransactionCalls):
    def __init__(
        self,
        segment: SegmentName,
        storage_root: str,
        durability: dict[str, Any],
        create: bool,
        incarnation: str,
        replica_name: str | None = None,
    ) -> None:
        """Open ``segment``'s storage of topic incarnation ``incarnation``; ``create``: lay it
        out if it is missing (a first open only: one after a restart whose storage is gone
        must fail, not serve an empty log in its place). A replica is named by its disk
        (``storage.placements.disk_id``, what ``storage.replica_sets`` records;
        ``replica_name`` for tests that run several on one)."""
        self._name = segment
        self._closed = False
        # With a disk per node, the segment is on this node's own (the controller pinned
        # its host here); else on the root every node shares.
        root = node_storage_root(storage_root) if storage_scope() == "node" else storage_root
        storage = IncarnationStorage(
            Path(root), self._name.topic, incarnation, Durability(**durability)
        )
        self._store = storage.open(
            self._name,
            create=create,
            in_layout=False,  # storage the controller did not lay out itself
            ack_timeout_s=env_float(ACK_TIMEOUT_ENV, DEFAULT_ACK_TIMEOUT_S),
            background_sync=True,  # by the flusher, off the event loop
        )
        self._guard = guard()
        self._namespace = self._name.topic.namespace_path
        self._data_plane: DataPlaneServer | None = None
        self._starting_data_plane = asyncio.Lock()
        self._durability = Durability(**durability)
        self._flusher = (
            IntervalFlusher(self._durability.interval_s, lambda: self._store.sync())
            if self._durability.policy == "interval"
            else None
        )
        self._ack_saver = (
            IntervalFlusher(ACK_SAVE_PERIOD_S, lambda: self._store.save_acks())
            if self._durability.policy != "fsync"
            else None
        )
        self._metrics = SegmentMetrics(self._name)
        self._offloading = asyncio.Lock()
        self._tier_error: dict[str, Any] | None = None  # the last failed move to the tier
        self._last_used = time.monotonic()  # a reader's or writer's last call: idle since
        catalog = Catalog()
        # Stats kept while it slept no longer hold once it runs (``storage.asleep``).
        SleepingSegments(catalog.store, self._name.topic, incarnation).woken(self._name.segment_id)
        # The authority on sizes, following the operator's changes within seconds.
        limits = _live_limits(catalog, self._namespace)
        self._joins = TxnJoins(str(self._name), catalog.store)
        if self._store.holds_undecided:
            ask_for_sweep(self._guard.internal_token())
        self._reader = SegmentReader(
            self._store, self._metrics, self._ack_saver, self._touch, self._still_open
        )
        self._appender = SegmentAppender(
            self._name, self._store, limits, self._metrics, self._appended, self._joins
        )
        self._roles = ReplicaRoles(
            self._name, self._store, ReplicaStateFile(self._store.directory, self._durability),
            replica_name=lambda: replica_name or disk_id(Path(root)),
            wait_for_data=self._reader.wait,
            on_committed=self._reader.wake, credential=self._guard.internal_token,
            drop_clients=self._drop_clients, on_copied=self._copied,
        )  # fmt: skip

    # --- data path ---------------------------------------------------------------

    async def append(
        self,
        batch: pa.RecordBatch,
        producer_id: str | None = None,
        sequence: int | None = None,
        *,
        txn_id: str | None = None,
        credential: str | None = None,
    ) -> tuple[int, int]:
        """Append a batch (of transaction ``txn_id``, joined first: ``TxnJoins``);
        returns (base offset, count). Raises ``SegmentTerminated``.

        A sequenced batch waits for its producer's previous sequence: Ray may
        start pipelined calls out of order, and per-producer order is part of
        the contract, not an accident of scheduling.
        """
        self._check(credential, Permission.PRODUCE)
        base, count = await self._appender.append(batch, producer_id, sequence, txn_id)
        if self._roles.leader is not None:
            await self._roles.leader.committed(base + count)
        return base, count

    async def offset_at_time(self, time_ms: int, *, credential: str | None = None) -> int:
        """The first offset published at or after ``time_ms`` (the end when none was)."""
        self._check(credential, Permission.CONSUME)
        return self._store.offset_at_time(time_ms)

    async def last_sequence(self, producer_id: str, *, credential: str | None = None) -> int:
        """The highest sequence this segment stored for ``producer_id`` (-1: none): how an
        idempotent writer learns, after a crash, which of its appends got here."""
        self._check(credential, Permission.PRODUCE)
        return self._store.last_sequence(producer_id)

    async def data_endpoint(self, *, credential: str | None = None) -> wire.Endpoint:
        """Where this segment's data plane listens (appends and reads over TCP, see
        ``runtime.wire``), and whether it speaks TLS (when ``RAYTOPICS_TLS_CERT`` and
        ``_KEY`` are set for the segment)."""
        self._check(credential, Permission.LOOKUP)
        async with self._starting_data_plane:
            if self._data_plane is None:
                server = DataPlaneServer(
                    self._append_frames,
                    self._serve_later,
                    self._authorize_connection,
                    _POLICY_WATCH,
                    lambda error: self._metrics.rejected(error.code),
                )
                host, told = addresses(ray.util.get_node_ip_address())
                await server.start(host, tls.server_context(), port_range(), told)
                self._data_plane = server
        return self._data_plane.endpoint

    async def read(
        self,
        offset: int,
        max_records: int = 10_000,
        wait_s: float = 0.0,
        *,
        credential: str | None = None,
    ) -> pa.RecordBatch:
        """Records from ``offset``; waits up to ``wait_s`` when there is nothing yet."""
        self._check(credential, Permission.CONSUME)
        return await self._reader.read(offset, max_records, wait_s)

    # --- lifecycle (fenced by controller epoch) ---------------------------------

    @property
    def incarnation(self) -> str:
        """The topic incarnation whose storage this segment serves."""
        return self._store.incarnation

    async def close(self) -> None:
        """Stop serving (the host's, when the segment hibernates, is deleted or is replaced):
        the data plane's connections drop, waiting reads and appends return, what the
        flusher owes is written, and the files are released. Calls after it fail as calls
        to an exited process would (``ActorUnavailableError``), and clients look the
        segment up again."""
        self._closed = True
        await self._roles.close()
        if self._data_plane is not None:
            self._data_plane.stop()
        self._appender.release_turns()
        self._reader.wake()
        if self._flusher is not None and self._flusher.pending:
            with contextlib.suppress(ScalableTopicsError):
                await asyncio.to_thread(self._store.sync)
        self._store.close()

    async def ready(self, *, credential: str | None = None) -> dict[str, Any]:
        """Cheap liveness probe: the segment is loaded and can serve."""
        self._check(credential, Permission.ADMIN)
        store = self._store
        return {
            "segmentId": self._name.segment_id,
            "incarnation": store.incarnation,
            "endOffset": store.end_offset,
            "terminated": store.terminated,
            "pid": os.getpid(),
        }

    async def terminate(
        self,
        epoch: int | None = None,
        sealed: tuple[tuple[int, ...], int] | None = None,
        *,
        credential: str | None = None,
    ) -> int:
        """Seal the segment; ``sealed``: (children, layout epoch) of the split or merge
        that replaces it, kept in its storage for recovery. A replicated segment's leader
        answers once its ack quorum holds the seal (``LeaderRole.sealed``); any other
        replica refuses (``_check_change``)."""
        self._check_change(credential)
        end = self._store.terminate(epoch, SealedBy(*sealed) if sealed is not None else None)
        self._reader.wake()
        self._appender.release_turns()
        if (leader := self._roles.leader) is not None:
            await leader.sealed()  # a replicated seal stands once its quorum holds it
        return end

    async def delete(self, epoch: int | None = None, *, credential: str | None = None) -> None:
        self._check(credential, Permission.ADMIN)
        self._store.delete(epoch)
        self._reader.wake()

    async def retain(
        self,
        oldest_publish_ms: int | None,
        max_bytes: int | None,
        *,
        credential: str | None = None,
    ) -> int:
        self._check(credential, Permission.ADMIN)
        return self._store.retain(oldest_publish_ms, max_bytes)

    async def check_epoch(self, epoch: int, *, credential: str | None = None) -> None:
        self._check(credential, Permission.ADMIN)
        self._store.check_epoch(epoch)

    # --- subscriptions and acks -------------------------------------------------

    async def create_subscription(
        self,
        name: str,
        position: Position = "earliest",
        epoch: int | None = None,
        *,
        credential: str | None = None,
    ) -> int:
        self._check_change(credential)
        return self._store.create_subscription(name, position, epoch)

    async def delete_subscription(
        self, name: str, epoch: int | None = None, *, credential: str | None = None
    ) -> None:
        self._check_change(credential)
        self._store.delete_subscription(name, epoch)

    async def seek(
        self,
        subscription: str,
        to: ResetTarget,
        epoch: int | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Move a subscription's cursor (``SegmentStore.seek``); the controller's, for a
        reset of the whole subscription."""
        self._check_change(credential)
        return self._store.seek(subscription, reset_target(to), epoch)

    async def subscriptions(self, *, credential: str | None = None) -> list[str]:
        self._check(credential, Permission.ADMIN)
        return self._store.subscriptions()

    async def position(
        self, subscription: str | None = None, *, credential: str | None = None
    ) -> dict[str, Any]:
        """The segment's end and whether it is sealed, and with a ``subscription`` its
        cursor and whether it is drained: what a reader needs to start and to finish,
        so it needs ``consume`` (not ``admin``)."""
        self._check(credential, Permission.CONSUME)
        store = self._store
        status = {
            "startOffset": store.start_offset,
            "endOffset": store.readable_end,
            "sizeBytes": store.size_bytes,
            "terminated": store.sealed_for_readers,
        }
        if subscription is not None:
            status["position"] = store.position(subscription)
            status["drained"] = store.drained(subscription)
        return status

    async def ack(
        self, subscription: str, offsets: list[int], *, credential: str | None = None
    ) -> None:
        """Acknowledge ``offsets`` one by one (a queue subscription's, or a transaction's
        pending acknowledgement applied on its commit)."""
        self._check(credential, Permission.CONSUME)
        self._store.ack(subscription, offsets)
        self._reader.wake()

    async def ack_cumulative(
        self, subscription: str, offset: int, *, credential: str | None = None
    ) -> None:
        self._check(credential, Permission.CONSUME)
        self._store.ack_cumulative(subscription, offset)

    async def stats(self, *, credential: str | None = None) -> dict[str, Any]:
        self._check(credential, Permission.ADMIN)
        self._metrics.flush()  # asked every maintenance round: quiet segments report too
        stats = self._store.stats()
        stats["idleS"] = round(time.monotonic() - self._last_used, 3)
        if self._tier_error is not None:
            stats["tierError"] = self._tier_error
        return stats

    async def offload(self, uri: str, *, credential: str | None = None) -> None:
        """Move this sealed segment's records to the tier at ``uri`` and serve them from
        there: copied and checked in a worker thread while the local log serves, then
        switched to at once on the actor's loop (``SegmentStore.use_tier``)."""
        self._check(credential, Permission.ADMIN)
        async with self._offloading:
            if self._store.tiered:
                return
            _, base = open_tier(uri)
            directory = tier_directory(base, self._name, self._store.incarnation)
            try:
                tiered = await asyncio.to_thread(self._store.copy_to_tier, uri, directory)
            except ScalableTopicsError as err:
                self._tier_error = {**err.to_dict(), "atMs": time.time_ns() // 1_000_000}
                raise
            self._store.use_tier(uri, tiered)
            self._tier_error = None

    # --- replication (the controller's, fenced by the segment's leader epoch) ----------

    async def lead(
        self,
        epoch: int,
        factor: int,
        ack_quorum: int,
        commit_timeout_s: float | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """Lead leader epoch ``epoch`` of this segment (``actors.segment.replication``)."""
        self._check(credential, Permission.ADMIN)
        return await self._roles.lead(epoch, Replication.of(factor, ack_quorum), commit_timeout_s)

    async def follow(
        self, epoch: int, leader: wire.Endpoint, *, credential: str | None = None
    ) -> dict[str, Any]:
        """Follow the leader of ``epoch``, whose data plane is at ``leader``."""
        self._check(credential, Permission.ADMIN)
        return await self._roles.follow(epoch, wire.Endpoint(*leader))

    async def fence(self, epoch: int, *, credential: str | None = None) -> dict[str, Any]:
        """An election at ``epoch``: this replica's newest epoch and end, and from now on
        no older leader is followed or served as one."""
        self._check(credential, Permission.ADMIN)
        report = await self._roles.fence(epoch)
        return {"replica": report.replica, "lastEpoch": report.last_epoch, "end": report.end,
                "sealed": report.sealed}  # fmt: skip

    async def hand_over(self, to: str, wait_s: float, *, credential: str | None = None) -> bool:
        """Stop taking appends until follower ``to`` holds this leader's whole log
        (``ReplicaRoles.hand_over``): an election then moves the lead there."""
        self._check(credential, Permission.ADMIN)
        return await self._roles.hand_over(to, wait_s)

    async def replica_status(self, *, credential: str | None = None) -> dict[str, Any]:
        """The replica's role and log (``Roles.status``), and where its data plane listens
        if it does: the controller probes it when this host falls silent, to tell a dead
        leader from a slow one (``actors.control.replica_asks``)."""
        self._check(credential, Permission.ADMIN)
        status = self._roles.status()
        if self._data_plane is not None:
            status["endpoint"] = [self._data_plane.endpoint.host, self._data_plane.endpoint.port]
        return status

    # --- internals ---------------------------------------------------------------

    def _check(self, credential: str | None, permission: Permission) -> None:
        self._still_open()
        if permission is not Permission.ADMIN:
            self._last_used = time.monotonic()
            if permission is not Permission.LOOKUP:
                self._roles.check_serves()
        try:
            self._guard.check(credential, permission, self._namespace)
        except ScalableTopicsError as err:
            self._metrics.rejected(err.code)
            raise

    def _check_change(self, credential: str | None) -> None:
        """The controller's change of the log or its cursors (a seal, a subscription made,
        deleted or reset) is its leader's to make: a follower copies it from there. Any
        other replica refuses (``NotLeaderError``; the controller looks the leader up
        again, as a producer does): a follower that took a seal would stop copying while
        its leader, unsealed, took appends no reader of the sealed segment reaches, and a
        cursor a follower took would be overwritten by its leader's next shipment."""
        self._check(credential, Permission.ADMIN)
        self._roles.check_serves()

    def _touch(self) -> None:
        self._last_used = time.monotonic()

    def _still_open(self) -> None:
        if self._closed:
            raise ActorUnavailableError(f"{self._name} is closed here; look it up again", None)

    def _authorize_connection(self, credential: str | None, access: int) -> None:
        """A data-plane connection's admission (and re-admission when the policy changes)."""
        if access & (wire.PRODUCE | wire.CONSUME):
            self._roles.check_serves()
        if access & wire.PRODUCE:
            self._guard.check(credential, Permission.PRODUCE, self._namespace)
        if access & wire.CONSUME:
            self._guard.check(credential, Permission.CONSUME, self._namespace)
        if access & wire.REPLICATE:
            self._guard.check_internal(credential, f"replicate segment {self._name}")

    async def _serve_later(self, body: bytes) -> bytes:
        """A data-plane frame that could not be answered at once: a stream consumer's
        read (a long-poll, after the cumulative ack it carries), a queue consumer's take
        or settle, or an append that waits for its producer's previous sequence."""
        if wire.is_append(body):
            return await self._answered(await self._appender.append_parked(body))
        store, op = self._store, body[0] if body else None
        try:
            if op == wire.OP_REPLICA_FETCH:
                leader = self._roles.leader
                if leader is None:
                    self._roles.check_serves()
                    raise InvalidArgumentError(f"{self._name} is not replicated")
                return await leader.serve_fetch(body)
            if op == wire.OP_QUEUE_TAKE:
                take = wire.decode_take(body)
                batch = await self._reader.take(*take)
                drained = wire.DRAINED if store.drained(take.subscription) else 0
                return wire.encode_records(
                    store.readable_end, store.sealed_for_readers, ipc_parts(batch), drained
                )
            if op == wire.OP_QUEUE_SETTLE:
                return self._reader.settle(wire.decode_settle(body))
            if op == wire.OP_SHARE_READ:
                return await self._reader.read_share(wire.decode_share_read(body))
            request = wire.decode_read(body)
            if request.ack is not None:
                self._reader.ack_with_read(request.subscription, request.ack)
            batch = await self._reader.read(request.offset, request.max_records, request.wait_s)
        except (ScalableTopicsError, ValueError) as err:
            return wire.encode_failure(err)
        except ActorUnavailableError:  # closed while it waited: its connection is gone too
            return wire.encode_failure(UnavailableError(f"{self._name} closed"))
        return wire.encode_records(store.readable_end, store.sealed_for_readers, ipc_parts(batch))

    def _appended(self) -> None:
        if self._flusher is not None:
            self._flusher.changed()
        if self._roles.leader is not None:
            self._roles.leader.appended()  # wakes readers when the high watermark moves
        self._reader.wake()  # a follower's fetch waits for new entries, committed or not

    def _copied(self) -> None:
        """A follower stored its leader's entries: flushed as its own appends would be."""
        if self._flusher is not None:
            self._flusher.changed()

    def _append_frames(self, bodies: list[memoryview]) -> list[bytes | asyncio.Future[bytes]]:
        """The data plane's appends: stored now; a leader's answered once committed."""
        responses = self._appender.append_frames(bodies)
        leader = self._roles.leader
        if leader is None:
            return list(responses)
        return [leader.answer(response) for response in responses]

    async def _answered(self, response: bytes) -> bytes:
        leader = self._roles.leader
        answer = leader.answer(response) if leader is not None else response
        return answer if isinstance(answer, bytes) else await answer

    def _drop_clients(self, keep_followers: bool = False) -> None:
        """Producers and readers connected to this replica go: it no longer serves them
        (``keep_followers``: its followers' connections stay, a lead being handed over)."""
        if self._data_plane is not None:
            self._data_plane.drop_connections(wire.REPLICATE if keep_followers else 0)


_limits_by_namespace: dict[str, LiveLimits] = {}


def _live_limits(catalog: Catalog, namespace: str) -> LiveLimits:
    """One copy of a namespace's limits per process: the segments a host serves share it,
    so the catalog is read once per refresh in the process rather than once per segment
    (the read is a GCS round trip on the event loop that every append waits behind)."""
    limits = _limits_by_namespace.get(namespace)
    if limits is None:
        limits = _limits_by_namespace[namespace] = LiveLimits(catalog, namespace)
    return limits
