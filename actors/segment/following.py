"""A follower replica's pull from its segment's leader (``FollowerRole``).

One task keeps one data-plane connection to the leader, greeted with the system's own
credential for ``REPLICATE`` access, and sends one fetch at a time; each fetch reports
what the last shipment stored, which is how the leader counts the follower toward its
quorum. The subscriptions' cursors ride the same stream: a shipment carries all of them
whenever they changed since the version the follower holds, so a new leader redelivers
at most what was acknowledged since its last copy, and never skips a message. It stops
for good when the leader or a shipment is fenced (``StaleEpochError``): only the
controller gives a replica its next role. Any other failure (the leader restarting, a
dropped connection) is retried with a backoff.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import replace

from runtime import wire
from runtime.errors import ScalableTopicsError, StaleEpochError, UnavailableError
from runtime.names import SegmentName
from runtime.replica_frames import decode_shipment, encode_fetch
from storage.replica_log import FollowerReplica

log = logging.getLogger(__name__)

# How long a follower's fetch waits at its leader for new entries: what an idle replicated
# segment costs (a fetch per follower this often; new entries end the wait at once).
FETCH_WAIT_S = 5.0
# A shipment this small is stored on the event loop: a thread hop would cost more.
INLINE_BYTES = 256 << 10
RETRY_S = (0.05, 2.0)  # a follower's backoff after a failed fetch: first, most
# A follower whose leader stopped answering tells the controller at most this often.
TELL_EVERY_S = 1.0


class FollowerRole:
    """Who calls: the segment (``start``, ``stop``). What it affects: the follower's log
    and ``replica.json``, through ``FollowerReplica``."""

    def __init__(
        self,
        name: SegmentName,
        replica: FollowerReplica,
        leader: wire.Endpoint,
        credential: Callable[[], str | None],
        tls: ssl.SSLContext | None,
        on_stored: Callable[[], None],
        adopt_cursors: Callable[[bytes], None],
        leader_lost: Callable[[], None],
    ) -> None:
        """``adopt_cursors``: hold the subscriptions' cursors the leader shipped;
        ``leader_lost``: the connection to the leader was refused, reset or closed (at most
        every ``TELL_EVERY_S``)."""
        self._name, self.replica, self.leader = name, replica, leader
        self._credential, self._tls, self._on_stored = credential, tls, on_stored
        self._adopt_cursors, self._leader_lost = adopt_cursors, leader_lost
        self._told_at = float("-inf")
        self.cursor_version = 0  # of the cursors held: none yet, so the first ships them
        self._task: asyncio.Task | None = None
        self.fenced: StaleEpochError | None = None  # why it stopped for good
        self.last_error: Exception | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.replica.save()

    async def _run(self) -> None:
        delay = RETRY_S[0]
        while True:
            try:
                await self._follow()
            except StaleEpochError as err:
                self.fenced = err
                log.info("%s: stopped following %s: %s", self._name, self.leader, err)
                return
            except (OSError, ScalableTopicsError, asyncio.IncompleteReadError, ssl.SSLError) as err:
                self.last_error = err
                log.debug("%s: fetch from %s failed: %r", self._name, self.leader, err)
                lost = isinstance(err, ConnectionError | asyncio.IncompleteReadError)
                if lost and time.monotonic() - self._told_at >= TELL_EVERY_S:
                    self._told_at = time.monotonic()
                    self._leader_lost()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_S[1])

    async def _follow(self) -> None:
        leader = self.leader
        reader, writer = await asyncio.open_connection(
            leader.host, leader.port, ssl=self._tls if leader.tls else None
        )
        try:
            writer.write(wire.encode_hello(self._credential(), wire.REPLICATE))
            welcome = await _frame(reader)
            if welcome[0] != wire.STATUS_OK:
                raise wire.decode_error(welcome)
            while True:
                fetch = replace(
                    self.replica.fetch(), wait_s=FETCH_WAIT_S, cursor_version=self.cursor_version
                )
                writer.write(encode_fetch(fetch))
                shipment = decode_shipment(await _frame(reader))
                if shipment.cursors:
                    self._adopt_cursors(bytes(shipment.cursors))
                    self.cursor_version = shipment.cursor_version
                if len(shipment.frames) < INLINE_BYTES:
                    self.replica.receive(shipment)
                else:  # a long write off the event loop, which serves other segments too
                    await asyncio.to_thread(self.replica.receive, shipment)
                self.last_error = None
                self._on_stored()
        finally:
            writer.close()


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = wire.LENGTH.unpack(await reader.readexactly(wire.LENGTH.size))
    if length > wire.MAX_FRAME:
        raise UnavailableError(f"a data plane frame of {length} bytes from the leader")
    return await reader.readexactly(length)
