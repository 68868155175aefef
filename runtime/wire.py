"""The segment data plane's wire format: appends and reads as length-prefixed binary frames.

Ray actor calls cost about a millisecond each on a small machine, which caps a
segment at ~1,000 appends/s however large the machine's disk bandwidth. So the
hot paths — appending batches and a stream consumer's long-poll reads — also
run over a plain TCP connection to the segment actor (Ray stays the control
plane: it finds, starts and restarts the actor and hands out its address).
Append frames carry the Arrow IPC bytes the log stores, untouched; a read is
answered with the delivery batch as an Arrow IPC stream.

    append   = u32 length | u8 op=APPEND | u16 len(producer id) | producer id
               | i64 sequence (-1: none) | Arrow IPC stream bytes
    read     = u32 length | u8 op=READ | i64 offset | u32 max records | u32 wait ms
               | i64 cumulative ack (-1: none) | u16 len(subscription) | subscription
    appended = u32 length | u8 status=OK | i64 base offset | i64 count
    records  = u32 length | u8 status=OK | i64 end offset | u8 terminated
               | Arrow IPC stream bytes (the delivery batch)
    error    = u32 length | u8 status=ERROR | JSON {"error": code, "message": ...}

A read's cumulative ack, applied before it reads, saves the consumer a call per
acknowledgement. Responses come back in request order on each connection.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from runtime.errors import InvalidArgumentError, ScalableTopicsError, error_from_code

LENGTH = struct.Struct("!I")
_REQUEST = struct.Struct("!BH")
_SEQUENCE = struct.Struct("!q")
_OK = struct.Struct("!Bqq")
_OK_FRAME = struct.Struct("!IBqq")  # length prefix and body in one pack
_READ = struct.Struct("!BqIIqH")
_RECORDS = struct.Struct("!BqB")
OP_APPEND = 1
OP_READ = 2
STATUS_OK = 0
STATUS_ERROR = 1
MAX_FRAME = 256 << 20


def frame_at(buffer: bytes | bytearray, start: int, end: int) -> tuple[int, int] | None:
    """``(body start, body end)`` of the frame at ``start`` once all of it is in
    ``buffer[:end]``, ``None`` while bytes are missing; a length over ``MAX_FRAME``
    raises ``InvalidArgumentError`` (the stream is not ours, or is corrupt)."""
    if end - start < LENGTH.size:
        return None
    (length,) = LENGTH.unpack_from(buffer, start)
    if length > MAX_FRAME:
        raise InvalidArgumentError(f"data plane frame of {length} bytes, over {MAX_FRAME}")
    body = start + LENGTH.size
    return (body, body + length) if end - body >= length else None


def is_append(body: bytes | memoryview) -> bool:
    """Whether a frame's body is an append (by its op byte; anything else is a read)."""
    return len(body) > 0 and body[0] == OP_APPEND


def encode_append(producer_id: str | None, sequence: int | None, payload: bytes) -> bytes:
    pid = (producer_id or "").encode()
    body_length = _REQUEST.size + len(pid) + _SEQUENCE.size + len(payload)
    return b"".join(
        (
            LENGTH.pack(body_length),
            _REQUEST.pack(OP_APPEND, len(pid)),
            pid,
            _SEQUENCE.pack(-1 if sequence is None else sequence),
            payload,
        )
    )


def decode_append(body: bytes | memoryview) -> tuple[str | None, int | None, memoryview]:
    """(producer id, sequence, Arrow IPC payload) of an append frame's body."""
    view = memoryview(body)
    if len(view) < _REQUEST.size + _SEQUENCE.size:
        raise InvalidArgumentError("data plane frame too short")
    op, pid_length = _REQUEST.unpack_from(view)
    if op != OP_APPEND:
        raise InvalidArgumentError(f"unknown data plane operation {op}")
    pid_end = _REQUEST.size + pid_length
    producer_id = bytes(view[_REQUEST.size : pid_end]).decode() or None
    (sequence,) = _SEQUENCE.unpack_from(view, pid_end)
    return producer_id, (None if sequence < 0 else sequence), view[pid_end + _SEQUENCE.size :]


class ReadRequest(NamedTuple):
    offset: int
    max_records: int
    wait_s: float
    subscription: str
    ack: int | None  # the subscription's cumulative ack, applied before reading


def encode_read(request: ReadRequest) -> bytes:
    subscription = request.subscription.encode()
    wait_ms = min(round(request.wait_s * 1000), 0xFFFFFFFF)
    head = _READ.pack(
        OP_READ,
        request.offset,
        request.max_records,
        wait_ms,
        -1 if request.ack is None else request.ack,
        len(subscription),
    )
    return LENGTH.pack(len(head) + len(subscription)) + head + subscription


def decode_read(body: bytes | memoryview) -> ReadRequest:
    if len(body) < _READ.size:
        raise InvalidArgumentError("data plane read frame too short")
    op, offset, max_records, wait_ms, ack, length = _READ.unpack_from(body)
    if op != OP_READ:
        raise InvalidArgumentError(f"unknown data plane operation {op}")
    if offset < 0 or max_records < 1:
        raise InvalidArgumentError(
            f"a read needs offset >= 0 and max records >= 1, got {offset} and {max_records}"
        )
    subscription = bytes(body[_READ.size : _READ.size + length]).decode()
    return ReadRequest(offset, max_records, wait_ms / 1000, subscription, None if ack < 0 else ack)


def encode_records(end_offset: int, terminated: bool, payload: Sequence[Any]) -> bytes:
    """``payload``: the pieces of the records' IPC stream (``batch.ipc_parts``)."""
    head = _RECORDS.pack(STATUS_OK, end_offset, terminated)
    size = len(head) + sum(len(part) for part in payload)
    return b"".join((LENGTH.pack(size), head, *payload))  # one copy


def decode_records(body: bytes) -> tuple[int, bool, memoryview]:
    """(the segment's end offset, whether it is terminated, Arrow IPC stream of the
    records read), or raise the typed error the segment reported."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    _, end_offset, terminated = _RECORDS.unpack_from(body)
    return end_offset, bool(terminated), memoryview(body)[_RECORDS.size :]


def encode_ok(base_offset: int, count: int) -> bytes:
    return _OK_FRAME.pack(_OK.size, STATUS_OK, base_offset, count)


def encode_error(error: ScalableTopicsError) -> bytes:
    body = bytes([STATUS_ERROR]) + json.dumps(error.to_dict()).encode()
    return LENGTH.pack(len(body)) + body


def encode_failure(error: Exception) -> bytes:
    """A typed error as itself; anything else (a frame that did not decode) as a
    malformed-frame ``InvalidArgumentError``."""
    if not isinstance(error, ScalableTopicsError):
        error = InvalidArgumentError(f"malformed data plane frame: {error}")
    return encode_error(error)


def decode_response(body: bytes) -> tuple[int, int]:
    """(base offset, count), or raise the typed error the segment reported."""
    if body[0] != STATUS_OK:
        _raise_error(body)
    _, base, count = _OK.unpack(body)
    return base, count


def _raise_error(body: bytes) -> None:
    data = json.loads(body[1:])
    raise error_from_code(data.get("error"), data.get("message", "data plane error"), 409)
