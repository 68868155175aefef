"""The on-disk frame of a segment log: one self-checking record of one append.

Each append is one frame (header + Arrow IPC payload) written with a single
``write`` call, which makes a crash leave at most one torn frame, at the tail of
the last chunk; recovery (``scan_frames``) stops at the first frame that is torn,
corrupt or out of sequence.

Frame layout (little endian)::

    magic      4s   b"RTSL"
    crc32c     u32  CRC-32C (Castagnoli, as Kafka's record batches) of every byte after
                    this field (header + payload); hardware-accelerated, so checking a
                    100 KB batch costs microseconds, not the ~80 us of zlib's CRC-32
    type       u8   BATCH, TERMINATION, TXN_BATCH or TXN_MARKER
    payload    u32  payload length in bytes
    base       i64  offset of the first record
    count      u32  number of records
    publish    i64  publish time, ms since the epoch
    sequence   i64  producer sequence, -1 if none
    pid_len    u16  length of the producer id
    producer   pid_len bytes of UTF-8, empty if none
    payload    Arrow IPC stream of one record batch

A transaction's batch (``TXN_BATCH``) is a batch whose producer field is
``{txn id}/{producer id}`` (a transaction id never holds a ``/``). Its fate is a
``TXN_MARKER`` frame written after it: one offset, no payload, the transaction id as
its producer field and 1 (commit) or 0 (abort) as its sequence. A marker takes an
offset as Kafka's control batches do, so that it is copied, retained and recovered like
any batch, and never delivered (``runtime.txn_visibility``).

The CRC sits right after the magic so that it also covers the frame type and the
lengths: a flipped bit anywhere in a frame is detected.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from fastcrc import crc32

from runtime.errors import InvalidArgumentError

MAGIC = b"RTSL"
FRAME_BATCH = 1
FRAME_TERMINATION = 2
FRAME_TXN_BATCH = 3
FRAME_TXN_MARKER = 4
BATCH_TYPES = (FRAME_BATCH, FRAME_TXN_BATCH)  # frames that hold records

PREFIX = struct.Struct("<4sI")
BODY = struct.Struct("<BIqIqqH")
HEADER_SIZE = PREFIX.size + BODY.size
MAX_PAYLOAD = (1 << 32) - 1
MAX_PRODUCER_ID = (1 << 16) - 1


class Frame(NamedTuple):
    """The header fields of one frame, as written or as recovered. A named tuple: every
    append makes one, and a frozen dataclass costs several times as much to build."""

    frame_type: int
    base_offset: int
    count: int
    publish_time_ms: int
    producer_id: str | None
    sequence: int | None
    txn_id: str | None = None  # of a transaction's batch or marker

    @property
    def producer_bytes(self) -> bytes:
        if self.txn_id is None:
            return self.producer_id.encode() if self.producer_id is not None else b""
        if self.frame_type == FRAME_TXN_MARKER:
            return self.txn_id.encode()
        return f"{self.txn_id}/{self.producer_id or ''}".encode()

    @property
    def committed(self) -> bool:
        """A marker's fate: whether its transaction committed."""
        return self.sequence == 1

    def length(self, payload_length: int) -> int:
        return HEADER_SIZE + len(self.producer_bytes) + payload_length


# A frame ready to write: its header, its payload, and the fields it was encoded from.
Encoded = tuple[bytes, bytes | memoryview, Frame]


def encode_frame(frame: Frame, payload: bytes | memoryview) -> Encoded:
    """(header, payload, frame): the frame as written, in two pieces, and its fields."""
    if len(payload) > MAX_PAYLOAD:
        raise InvalidArgumentError(f"batch too large: {len(payload)} bytes serialized")
    producer = frame.producer_bytes
    checked = (
        BODY.pack(
            frame.frame_type,
            len(payload),
            frame.base_offset,
            frame.count,
            frame.publish_time_ms,
            -1 if frame.sequence is None else frame.sequence,
            len(producer),
        )
        + producer
    )
    return PREFIX.pack(MAGIC, checksum(checked, payload)) + checked, payload, frame


def checksum(head: bytes | memoryview, rest: bytes | memoryview) -> int:
    """A frame's CRC-32C over ``head`` then ``rest``: one function for writing and
    checking. fastcrc's "iscsi" (carry-less multiply) is the fastest of the packages
    measured that give this value (bench/README.md, "Design measurements")."""
    return crc32.iscsi(rest, crc32.iscsi(head))


def scan_frames(file: BinaryIO, expected_offset: int) -> Iterator[tuple[Frame, int]]:
    """Yield the valid frames of a chunk (with their payload length) in order,
    stopping at the first torn, corrupt or out-of-sequence one."""
    file_size = os.fstat(file.fileno()).st_size
    while True:
        decoded = _read_frame(file, file_size, expected_offset)
        if decoded is None:
            return
        expected_offset += decoded[0].count
        yield decoded


def _read_frame(file: BinaryIO, file_size: int, expected_offset: int) -> tuple[Frame, int] | None:
    """The next frame if it is complete, checksum-valid and in sequence, else None."""
    header = file.read(HEADER_SIZE)
    if len(header) < HEADER_SIZE:
        return None
    rest_length = _rest_length(header)
    # A torn length field can claim gigabytes: check it against the file before reading.
    if rest_length is None or file.tell() + rest_length > file_size:
        return None
    return _decoded(header, file.read(rest_length), expected_offset)


def split_frames(data: bytes | memoryview, expected_offset: int) -> list[Encoded]:
    """Whole frames copied from another log (a leader's, to a follower), each checked as
    recovery checks a chunk's: the first that is torn, corrupt or out of sequence refuses
    them all, so a copy is stored whole or not at all."""
    view, frames, position = memoryview(data), [], 0
    while position < len(view):
        header = bytes(view[position : position + HEADER_SIZE])
        rest_length = _rest_length(header) if len(header) == HEADER_SIZE else None
        end = position + HEADER_SIZE + (rest_length or 0)
        rest = view[position + HEADER_SIZE : end]
        decoded = None if rest_length is None or len(rest) < rest_length else (
            _decoded(header, rest, expected_offset)
        )  # fmt: skip
        if decoded is None:
            raise InvalidArgumentError(
                f"copied frames: the frame at byte {position} (offset {expected_offset}) is "
                "torn, corrupt or out of sequence"
            )
        frame, payload_length = decoded
        frames.append(
            (bytes(view[position : end - payload_length]), view[end - payload_length : end], frame)
        )
        expected_offset += frame.count
        position = end
    return frames


def _rest_length(header: bytes) -> int | None:
    """The producer id's and payload's bytes that follow a frame's header; None if the
    header is not a frame's."""
    magic, _ = PREFIX.unpack_from(header)
    if magic != MAGIC:
        return None
    _, payload_length, _, _, _, _, pid_length = BODY.unpack_from(header, PREFIX.size)
    return pid_length + payload_length


def _decoded(
    header: bytes, rest: bytes | memoryview, expected_offset: int
) -> tuple[Frame, int] | None:
    """The frame of ``header`` and ``rest`` with its payload length, if its checksum holds
    and it is the next in sequence."""
    _, crc = PREFIX.unpack_from(header)
    frame_type, payload_length, base, count, publish, sequence, pid_length = BODY.unpack_from(
        header, PREFIX.size
    )
    if checksum(header[PREFIX.size :], rest) != crc:
        return None
    if base != expected_offset or not _plausible(frame_type, count):
        return None
    producer = bytes(rest[:pid_length]).decode() if pid_length else None
    txn = None
    if frame_type == FRAME_TXN_BATCH and producer is not None:
        txn, _, producer = producer.partition("/")
        producer = producer or None
    elif frame_type == FRAME_TXN_MARKER:
        txn, producer = producer, None
    frame = Frame(
        frame_type=frame_type,
        base_offset=base,
        count=count,
        publish_time_ms=publish,
        producer_id=producer,
        sequence=None if sequence < 0 else sequence,
        txn_id=txn,
    )
    return frame, payload_length


_COUNTS = {FRAME_TERMINATION: 0, FRAME_TXN_MARKER: 1}  # the frames that hold no records


def _plausible(frame_type: int, count: int) -> bool:
    if frame_type in BATCH_TYPES:
        return count > 0
    return _COUNTS.get(frame_type) == count
