"""What a stream or checkpoint consumer knows of one segment it reads: where its reads,
the application's deliveries and the acknowledgements stand, and the connections it
reads and settles on. The consumer's loop (``clients._group_core``) moves the reads and
the flushes; the application's thread moves ``delivered`` under ``delivering``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from clients._data_plane import ReadChannel
from runtime.assignment import Share
from runtime.names import SegmentName


class SegmentReader:
    """Reads one assigned segment from ``position`` on, in order."""

    def __init__(
        self,
        name: SegmentName,
        handle: Any,
        position: int,
        credential: str | None,
        share: Share | None = None,
    ) -> None:
        self.name = name
        self.segment_id = name.segment_id
        self.credential = credential
        self.share = share if share is not None else Share(name.segment_id)
        self.channel = ReadChannel(handle, credential=credential)
        self.settles: ReadChannel | None = None  # a part's individual acks go here
        self.sent: list[np.ndarray] = []  # a part's delivered offsets not yet acknowledged
        self.last_read_at = 0.0  # when the last read was sent; later acks ride on the next
        self.ack_sent_at = 0.0
        self.position = position  # next offset to fetch
        self.delivered = position  # next offset the application has not received
        self.acked = position  # next offset not acknowledged
        self.flushed = position  # what the segment's cursor knows
        self.end: int | None = None  # known once the segment is sealed and read out
        self.revoked = False
        # Held by the application's thread from its look at ``revoked`` to its update of
        # ``delivered``, and by the loop as it revokes: a release then waits for the
        # acknowledgement of every run handed out, or the run is dropped.
        self.delivering = threading.Lock()
        self.task: asyncio.Task | None = None
        # The last read's step over records no reader gets (transaction markers, aborted
        # records): (from, to). Delivering or acknowledging up to ``from`` is up to ``to``.
        self.skip: tuple[int, int] | None = None

    def read_up_to(self, after: int, following: int) -> None:
        """A read whose records end before ``after`` said the next read starts at
        ``following``."""
        self.position = max(self.position, following)
        if following > after:
            self.skip = (after, following)
            self.step_over()

    def step_over(self) -> None:
        """Carry what was delivered and acknowledged over the last skipped records."""
        if self.skip is not None:
            start, end = self.skip
            if self.delivered >= start:
                self.delivered = max(self.delivered, end)
            if self.acked >= start:
                self.acked = max(self.acked, end)

    @property
    def handle(self) -> Any:
        """The segment's actor as the reads found it last (a leader may have moved)."""
        return self.channel.handle

    @property
    def part(self) -> bool:
        """Whether it reads some of the segment's key buckets only."""
        return not self.share.whole

    def settle_channel(self) -> ReadChannel:
        if self.settles is None:
            self.settles = ReadChannel(self.handle, credential=self.credential)
        return self.settles

    def close(self) -> None:
        self.channel.close()
        if self.settles is not None:
            self.settles.close()
