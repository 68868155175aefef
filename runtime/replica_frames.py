"""The data-plane frames between a segment's replicas (``runtime.wire`` owns the frame
kinds and the connection; this module the two frames replication adds):

    fetch    = u32 length | u8 op=REPLICA_FETCH | i64 seen epoch | i64 adopted epoch
               | i64 offset | u32 max bytes | u32 wait ms | i64 cursor version
               | u8 flags (1: the follower's log is sealed at offset) | u16 len(replica)
               | replica
    shipment = u32 length | u8 status=OK | i64 epoch | i64 start | i64 end
               | i64 high watermark | i64 offset | i64 cursor version
               | u32 len(cursors) | u16 epoch starts | u8 flags (1: the leader's log is
               sealed at its end) | (i64 epoch, i64 offset) per start
               | cursors (JSON, when the follower's version differs) | stored frames

A follower sends fetches on a connection of its own to its leader's segment; the
leader answers each with a shipment (``runtime.replication.Fetch`` and ``Shipment``
say what the fields mean). The stored frames travel as the log holds them
(``storage.frames``): the follower checks each frame's checksum before it stores
anything, so a corrupt or cut shipment changes nothing.

Every field is checked as it is decoded, as for every other frame: a peer that lies
gets ``InvalidArgumentError``, never a replica state that breaks the rules (an epoch
history whose epochs do not rise is refused here, not stored).
"""

from __future__ import annotations

import struct

from runtime import wire
from runtime.errors import InvalidArgumentError
from runtime.replication import EpochHistory, Fetch, Shipment

_FETCH = struct.Struct("!BqqqIIqBH")
_SHIPMENT = struct.Struct("!BqqqqqqIHB")
SEALED = 1
_START = struct.Struct("!qq")
# More epochs than a log could see in its life: every failover is one.
MAX_EPOCH_STARTS = 65_535
MAX_REPLICA_NAME = 256  # bytes of UTF-8; replicas are named by Ray node ids


def encode_fetch(fetch: Fetch) -> bytes:
    replica = fetch.replica.encode()
    if len(replica) > MAX_REPLICA_NAME:
        raise InvalidArgumentError(f"a replica name of {len(replica)} bytes")
    head = _FETCH.pack(
        wire.OP_REPLICA_FETCH,
        fetch.seen_epoch,
        fetch.adopted_epoch,
        fetch.offset,
        min(fetch.max_bytes, wire.MAX_FRAME // 2),
        wire.millis(fetch.wait_s),
        fetch.cursor_version,
        SEALED if fetch.sealed else 0,
        len(replica),
    )
    return wire.LENGTH.pack(len(head) + len(replica)) + head + replica


def decode_fetch(body: bytes | memoryview) -> Fetch:
    if len(body) < _FETCH.size:
        raise InvalidArgumentError("data plane replica fetch frame too short")
    op, seen, adopted, offset, max_bytes, wait_ms, cursors, flags, length = _FETCH.unpack_from(body)
    if op != wire.OP_REPLICA_FETCH:
        raise InvalidArgumentError(f"unknown data plane operation {op}")
    if min(seen, adopted, offset) < 0 or adopted > seen or max_bytes < 1:
        raise InvalidArgumentError(
            "a replica fetch needs epochs and offset >= 0, an adopted epoch not after the "
            f"seen one and max bytes >= 1; got seen {seen}, adopted {adopted}, offset "
            f"{offset}, max bytes {max_bytes}"
        )
    if flags & ~SEALED:
        raise InvalidArgumentError(f"a replica fetch with unknown flags {flags:#x}")
    if length > MAX_REPLICA_NAME or len(body) != _FETCH.size + length:
        raise InvalidArgumentError("a replica fetch frame's name does not fit it")
    replica = wire.text(body[_FETCH.size :])
    return Fetch(
        replica, seen, adopted, offset, max_bytes, wait_ms / 1000, cursors, bool(flags & SEALED)
    )


def encode_shipment(shipment: Shipment) -> list[bytes | memoryview]:
    """The frame's pieces, written together: the stored frames are not copied into it."""
    starts = shipment.history.starts
    head = _SHIPMENT.pack(
        wire.STATUS_OK,
        shipment.epoch,
        shipment.start,
        shipment.end,
        shipment.high_watermark,
        shipment.offset,
        shipment.cursor_version,
        len(shipment.cursors),
        len(starts),
        SEALED if shipment.sealed else 0,
    )
    history = b"".join(_START.pack(start.epoch, start.offset) for start in starts)
    size = len(head) + len(history) + len(shipment.cursors) + len(shipment.frames)
    return [wire.LENGTH.pack(size) + head + history + shipment.cursors, shipment.frames]


def decode_shipment(body: bytes | memoryview) -> Shipment:
    """The leader's shipment, or the typed error it answered with."""
    if not len(body):
        raise InvalidArgumentError("an empty data plane frame")
    if body[0] != wire.STATUS_OK:
        raise wire.decode_error(bytes(body))
    if len(body) < _SHIPMENT.size:
        raise InvalidArgumentError("data plane shipment frame too short")
    _, epoch, start, end, high_watermark, offset, cursor_version, cursors_length, count, flags = (
        _SHIPMENT.unpack_from(body)
    )
    if min(epoch, start, offset, high_watermark) < 0 or not start <= end or high_watermark > end:
        raise InvalidArgumentError(
            f"a shipment of epoch {epoch} with start {start}, end {end}, high watermark "
            f"{high_watermark} and offset {offset} breaks the log's order"
        )
    cursors_at = _SHIPMENT.size + count * _START.size
    frames_at = cursors_at + cursors_length
    if len(body) < frames_at:
        raise InvalidArgumentError("a shipment frame too short for its epoch history and cursors")
    history = EpochHistory()
    try:
        for i in range(count):
            epoch_i, offset_i = _START.unpack_from(body, _SHIPMENT.size + i * _START.size)
            if epoch_i < 1 or offset_i < 0:
                raise ValueError(f"epoch {epoch_i} at offset {offset_i}")
            history = history.begin(epoch_i, offset_i)
    except ValueError as err:
        raise InvalidArgumentError(f"a shipment's epoch history breaks its rules: {err}") from None
    if history.last_epoch > epoch:
        raise InvalidArgumentError(
            f"a shipment of epoch {epoch} holds a history up to epoch {history.last_epoch}"
        )
    view = memoryview(body)
    return Shipment(
        epoch, history, start, end, high_watermark, offset, view[frames_at:],
        cursor_version, view[cursors_at:frames_at], bool(flags & SEALED),
    )  # fmt: skip
