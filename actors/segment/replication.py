"""A segment's part in its replication: leading, or following its leader.

The rules are ``runtime.replication``'s and the files ``storage.replica_log``'s; this
module adds what needs an event loop and sockets:

- ``LeaderRole``: an append is stored at once, as in an unreplicated segment (so a
  producer's pipeline keeps the disk busy), and *answered* once the high watermark
  covers it, or with ``NotEnoughReplicasError`` naming the segment when the quorum
  does not hold it within ``commit_timeout_s``. Readers see only what is below the
  high watermark (``SegmentStore.limit_reads``). Followers' fetches arrive as
  data-plane frames and wait, like a consumer's long-poll, until there is something
  to ship.
- ``FollowerRole`` (``actors.segment.following``): a task that pulls from the leader.
- ``ReplicaRoles``: which of the two this replica plays now, as the controller says.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from actors.segment.following import FollowerRole
from actors.segment.lookup import leader_unreachable
from runtime import tls, wire
from runtime.errors import (
    NotEnoughReplicasError,
    NotLeaderError,
    ScalableTopicsError,
    UnavailableError,
)
from runtime.names import SegmentName
from runtime.replica_frames import decode_fetch, encode_shipment
from runtime.replication import Fetch, ReplicaReport, Replication
from storage.replica_log import FollowerReplica, LeaderReplica
from storage.replica_state import ReplicaStateFile
from storage.segment_log import SegmentLog
from storage.segment_store import SegmentStore

log = logging.getLogger(__name__)

# How long an append waits for its quorum before its producer hears why not: below a
# producer's send time-out (60 s by default), so the error, not a time-out, reaches it.
DEFAULT_COMMIT_TIMEOUT_S = 10.0
# The longest a follower's fetch may ask to wait at its leader for new entries.
MAX_FETCH_WAIT_S = 30.0
# How often a waiting fetch looks whether the cursors moved: how late an acknowledgement
# made while no entry arrives reaches the followers.
CURSOR_LOOK_S = 0.25
EXPIRY_STEP_S = 0.1  # how often, at most, a leader looks for appends past their time-out
HAND_OVER_LOOK_S = 0.01  # how often a leader handing over looks at its follower's progress
HAND_OVER_HOLD_S = 5.0  # appends stay refused this long after a hand-over, for its election


class LeaderRole:
    """Who calls: the segment, after each group of appends is stored (``appended``), on
    each append's answer (``answer``, ``committed``) and on each follower's fetch
    (``serve_fetch``). What it affects: when producers hear back, and the store's
    readable end."""

    def __init__(
        self,
        name: SegmentName,
        store: SegmentStore,
        replica: LeaderReplica,
        wait_for_data: Callable[[float], Awaitable[None]],
        on_committed: Callable[[], None],
        commit_timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S,
    ) -> None:
        self._name, self._store, self.replica = name, store, replica
        self._wait_for_data, self._on_committed = wait_for_data, on_committed
        self._commit_timeout_s = commit_timeout_s
        # (end, arrival, deadline, future, answer): answers waiting for the high watermark
        self._waiting: list[tuple[int, int, float, asyncio.Future[bytes], bytes]] = []
        self._arrivals = itertools.count()
        # One timer for every waiting answer's time-out, not one per append.
        self._timer: asyncio.TimerHandle | None = None
        self._seal_waiters: list[asyncio.Future[None]] = []  # ``sealed`` callers
        self.handing_over = False  # no append is taken while the lead moves elsewhere
        store.limit_reads(replica.hw)

    @property
    def epoch(self) -> int:
        return self.replica.epoch

    def appended(self) -> None:
        self._advance(self.replica.appended())

    def answer(self, response: bytes) -> bytes | asyncio.Future[bytes]:
        """An append's answer, as it is or once the entries it names are committed."""
        body = memoryview(response)[wire.LENGTH.size :]
        if body[0] != wire.STATUS_OK:
            return response  # refused: nothing to wait for
        base, count = wire.decode_response(bytes(body))
        return self._when_committed(base + count, response)

    async def committed(self, end: int) -> None:
        """Wait until the entries below ``end`` are committed (a Ray call's append)."""
        answer = self._when_committed(end, b"")
        if isinstance(answer, asyncio.Future):
            answer = await answer
        if answer:
            raise wire.decode_error(answer[wire.LENGTH.size :])

    async def sealed(self) -> None:
        """Wait until the ack quorum holds the sealed log whole: an election among any
        replicas it needs then chooses a sealed copy, so no producer's append is taken
        after the seal by a new leader. ``NotEnoughReplicasError`` naming the segment
        when that takes longer than an append's ``commit_timeout_s``; the seal stands, and
        asking again waits again. Who calls: the segment's ``terminate``."""
        if self.replica.seal_held:
            return
        future = asyncio.get_running_loop().create_future()
        self._seal_waiters.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), self._commit_timeout_s)
        except TimeoutError:
            raise NotEnoughReplicasError(
                f"{self._name}: sealed at offset {self._store.end_offset}, but "
                f"{self.replica.ack_quorum} replicas did not hold the seal within "
                f"{self._commit_timeout_s:g}s (epoch {self.epoch}; followers holding the "
                f"sealed log: {', '.join(sorted(self.replica.sealed_by)) or 'none'})"
            ) from None
        finally:
            if future in self._seal_waiters:
                self._seal_waiters.remove(future)

    def _seal_news(self) -> None:
        if self._seal_waiters and self.replica.seal_held:
            waiters, self._seal_waiters = self._seal_waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def serve_fetch(self, body: bytes) -> bytes:
        """A follower's fetch: counted, then answered with what follows its offset, at
        once or when there is some (or when its wait is over)."""
        fetch = decode_fetch(body)
        shipment = self.replica.ship(fetch)
        self._advance(self.replica.hw)
        self._seal_news()
        store = self._store
        if (
            not shipment.frames
            and store.cursor_version == fetch.cursor_version
            and fetch.wait_s > 0
            and fetch.offset == shipment.end
            and not (shipment.sealed and not fetch.sealed)
        ):
            await self._wait_for_news(fetch)
            shipment = self.replica.ship(replace(fetch, wait_s=0))
        if store.cursor_version != fetch.cursor_version:
            version, cursors = store.export_cursors()
            shipment = replace(shipment, cursor_version=version, cursors=cursors)
        return b"".join(encode_shipment(shipment))

    async def _wait_for_news(self, fetch: Fetch) -> None:
        """Until the log grows past the fetch, is sealed, the cursors move, or the fetch's
        wait is over: looked at every ``CURSOR_LOOK_S``, so an acknowledgement reaches the
        followers that soon even while no entry arrives (a failover then redelivers
        little of what was acknowledged)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + min(fetch.wait_s, MAX_FETCH_WAIT_S)
        store = self._store
        while (left := until - loop.time()) > 0:
            await self._wait_for_data(min(left, CURSOR_LOOK_S))
            if store.end_offset > fetch.offset or store.cursor_version != fetch.cursor_version:
                return
            if store.terminated and not fetch.sealed:
                return

    def stop(self, why: ScalableTopicsError) -> None:
        """Leading ends (a new epoch elsewhere, the segment closing): every waiting
        append hears ``why``; none is acknowledged any more."""
        waiting, self._waiting = self._waiting, []
        for _, _, _, future, _ in waiting:
            if not future.done():
                future.set_result(wire.encode_error(why))
        sealing, self._seal_waiters = self._seal_waiters, []
        for seal in sealing:
            if not seal.done():
                seal.set_exception(why)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._store.deleted:  # a deleted segment's directory is gone
            self.replica.save()

    def _when_committed(self, end: int, answer: bytes) -> bytes | asyncio.Future[bytes]:
        if end <= self.replica.hw:
            return answer
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        deadline = loop.time() + self._commit_timeout_s
        heapq.heappush(self._waiting, (end, next(self._arrivals), deadline, future, answer))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire_due)
        return future

    def _advance(self, hw: int) -> None:
        before = self._store.readable_end
        self._store.limit_reads(hw)
        waiting = self._waiting
        while waiting and waiting[0][0] <= hw:
            _, _, _, future, answer = heapq.heappop(waiting)
            if not future.done():
                future.set_result(answer)
        if self._store.readable_end != before:
            self._on_committed()

    def _expire_due(self) -> None:
        """Answer every waiting append whose time is up, then wait for the next one's
        (at most ``EXPIRY_STEP_S`` apart: each look goes through all that wait)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        left = []
        for entry in self._waiting:
            end, _, deadline, future, _ = entry
            if future.done():
                continue
            if deadline <= now:
                self._expire(future, end)
            else:
                left.append(entry)
        heapq.heapify(left)
        self._waiting = left
        self._timer = None
        if left:
            at = max(min(entry[2] for entry in left), now + EXPIRY_STEP_S)
            self._timer = loop.call_at(at, self._expire_due)

    def _expire(self, future: asyncio.Future[bytes], end: int) -> None:
        error = NotEnoughReplicasError(
            f"{self._name}: the entries up to offset {end} were not held by "
            f"{self.replica.ack_quorum} replicas within {self._commit_timeout_s:g}s (epoch "
            f"{self.epoch}; followers holding them: {self._holding(end)}); they are not "
            "acknowledged, and a retry with the same sequence is stored once"
        )
        future.set_result(wire.encode_error(error))

    def _holding(self, end: int) -> str:
        names = [name for name, held in sorted(self.replica.followers.items()) if held >= end]
        return ", ".join(names) or "none"


class ReplicaRoles:
    """The role this segment's replica has now: none (an unreplicated segment), leader
    or follower. Only the controller changes it (``lead``, ``follow``, ``fence``), each
    time at an epoch no older than the last; a replica's saved state refuses an older
    one across restarts too (``storage.replica_state``).

    Who calls: the segment actor, for the controller's calls and on its data path
    (``leader`` answers appends; ``check_serves`` refuses producers and readers on a
    follower)."""

    def __init__(
        self,
        name: SegmentName,
        store: SegmentStore,
        state_file: ReplicaStateFile,
        replica_name: Callable[[], str],
        wait_for_data: Callable[[float], Awaitable[None]],
        on_committed: Callable[[], None],
        credential: Callable[[], str | None],
        drop_clients: Callable[..., None],
        on_copied: Callable[[], None],
    ) -> None:
        """``on_copied``: a follower stored a shipment (its log's flusher is owed a sync)."""
        self._name, self._store, self._state_file = name, store, state_file
        self._replica_name = replica_name
        self._named: str | None = None
        self._wait_for_data, self._on_committed = wait_for_data, on_committed
        self._credential, self._drop_clients = credential, drop_clients
        self._on_copied = on_copied
        self.leader: LeaderRole | None = None
        self.follower: FollowerRole | None = None
        self._telling: set[asyncio.Task] = set()  # tells the controller a leader is lost
        self._is_replica: bool | None = None  # laid out as one, or given a role since

    def _replicated(self) -> bool:
        if self._is_replica is None:
            self._is_replica = self._state_file.exists()
        return self._is_replica

    @property
    def replica_name(self) -> str:
        """This replica's name (its disk's id), looked up when replication first needs it:
        an unreplicated segment never does."""
        if self._named is None:
            self._named = self._replica_name()
        return self._named

    def check_serves(self) -> None:
        """Producers and readers are served by the leader only; a replica without a role
        (opened, or restarted, and not told yet) serves nobody: if it was the leader, its
        log may have lost a tail its followers hold, and only an election says who leads."""
        if self.leader is not None:
            if self.leader.handing_over:
                raise NotLeaderError(
                    f"{self._name}: this replica ({self.replica_name}) hands its lead over to "
                    "another; look the segment up again"
                )
            return
        if self.follower is None and self._replicated():
            raise NotLeaderError(
                f"{self._name}: this replica ({self.replica_name}) waits for its controller "
                "to say who leads; try again shortly"
            )
        if self.follower is not None:
            raise NotLeaderError(
                f"{self._name}: this replica ({self.replica_name}) follows the leader at "
                f"{self.follower.leader.host}:{self.follower.leader.port}; look the segment up "
                "again"
            )

    async def lead(
        self, epoch: int, replication: Replication, commit_timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Lead ``epoch``: the log's end begins it, and from now on appends are answered
        once ``replication.ack_quorum`` replicas hold them."""
        self._is_replica = True
        await self._end_following()
        replica = LeaderReplica(self.replica_name, self._log, self._state_file, replication, epoch)
        if self.leader is not None:
            self.leader.stop(NotLeaderError(f"{self._name}: epoch {epoch} took over; retry"))
        self.leader = LeaderRole(
            self._name, self._store, replica, self._wait_for_data, self._on_committed,
            commit_timeout_s or DEFAULT_COMMIT_TIMEOUT_S,
        )  # fmt: skip
        self.leader.appended()  # with an ack quorum of 1, what it holds is committed
        return self.status()

    async def follow(self, epoch: int, leader: wire.Endpoint) -> dict[str, Any]:
        """Follow the leader of ``epoch`` at ``leader``: fenced at ``epoch`` first, so no
        older leader's shipment is taken; producers and readers are sent away."""
        self._is_replica = True
        self._stop_leading(epoch)
        await self._end_following()
        replica = FollowerReplica(self.replica_name, self._log, self._state_file)
        replica.fence(epoch)
        self._store.limit_reads(replica.hw)
        self._drop_clients()

        def copied() -> None:
            self._store.limit_reads(replica.hw)
            self._on_copied()

        self.follower = FollowerRole(
            self._name, replica, leader, self._credential, tls.client_context(), copied,
            self._store.adopt_cursors, self._leader_lost,
        )  # fmt: skip
        self.follower.start()
        return self.status()

    async def hand_over(self, to: str, wait_s: float) -> bool:
        """Stop taking appends (producers and readers are sent away, and come back once
        the segment is looked up again) and wait until follower ``to`` holds this
        leader's whole log, so that the election its controller runs next finds them
        equally up to date. ``False``, and appends taken again, when ``to`` does not get
        there within ``wait_s``; on ``True``, appends stay refused until that election
        fences this replica, or for ``HAND_OVER_HOLD_S`` if it never comes. Who calls:
        the controller, moving a lead off its own node."""
        leader = self.leader
        if leader is None:
            raise NotLeaderError(f"{self._name}: this replica does not lead; nothing to hand over")
        leader.handing_over = True
        self._drop_clients(keep_followers=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while leader.replica.followers.get(to, -1) < self._log.end_offset:
            if loop.time() >= deadline or self.leader is not leader:
                leader.handing_over = False
                return False
            await asyncio.sleep(HAND_OVER_LOOK_S)
        loop.call_later(HAND_OVER_HOLD_S, setattr, leader, "handing_over", False)
        return True

    def _leader_lost(self) -> None:
        """The leader followed stopped answering: its controller's next replica round
        comes at once rather than within a round's pause, so a dead leader is replaced
        sooner (``actors.control.replica_asks`` tells dead from slow)."""
        task = asyncio.get_running_loop().create_task(
            leader_unreachable(self._name, self._credential())
        )
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def fence(self, epoch: int) -> ReplicaReport:
        """An election at ``epoch``: stop leading or following, refuse every older
        leader from now on (durably), and report this log's newest epoch and end."""
        self._is_replica = True
        self._stop_leading(epoch)
        await self._end_following()
        return FollowerReplica(self.replica_name, self._log, self._state_file).fence(epoch)

    def status(self) -> dict[str, Any]:
        """This replica's role, epoch, end and high watermark; a leader's followers; why
        its files are gone from its disk, if they are."""
        store = self._store
        status: dict[str, Any] = {
            "replica": self.replica_name,
            "endOffset": store.end_offset,
            "highWatermark": store.readable_end,
            "cursorVersion": store.cursor_version,  # a follower's: its leader's it holds
            "filesLost": self._log.files_lost(),  # the controller rebuilds such a replica
        }
        if self.leader is not None:
            status |= {"role": "leader", "epoch": self.leader.epoch,
                       "ackQuorum": self.leader.replica.ack_quorum,
                       "followers": self.leader.replica.followers}  # fmt: skip
        elif self.follower is not None:
            state = self.follower.replica.state
            error = self.follower.fenced or self.follower.last_error
            status |= {"role": "follower", "epoch": state.seen_epoch,
                       "cursorVersion": self.follower.cursor_version,
                       "leader": f"{self.follower.leader.host}:{self.follower.leader.port}",
                       "error": None if error is None else repr(error)}  # fmt: skip
        else:
            status["role"] = "none"
        return status

    async def close(self) -> None:
        self._stop_leading(None)
        await self._end_following()

    @property
    def _log(self) -> SegmentLog:
        return self._store.replica_log

    def _stop_leading(self, epoch: int | None) -> None:
        if self.leader is None:
            return
        # Retried by producers: the new leader stores what it already holds once.
        why = UnavailableError(f"{self._name} closed") if epoch is None else NotLeaderError(
            f"{self._name}: epoch {epoch} took over from {self.leader.epoch}; look the "
            "segment up again"
        )  # fmt: skip
        self.leader.stop(why)
        self.leader = None
        self._drop_clients()

    async def _end_following(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
