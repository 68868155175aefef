"""The segment data plane's wire format: appends as length-prefixed binary frames.

Ray actor calls cost about a millisecond each on a small machine, which caps a
segment at ~1,000 appends/s however large the machine's disk bandwidth. So the
hot path — appending batches — also runs over a plain TCP connection to the
segment actor (Ray stays the control plane: it finds, starts and restarts the
actor and hands out its address). Frames carry the Arrow IPC bytes the log
stores, untouched.

    request  = u32 length | u8 op=APPEND | u16 len(producer id) | producer id
               | i64 sequence (-1: none) | Arrow IPC stream bytes
    response = u32 length | u8 status=OK    | i64 base offset | i64 count
             | u32 length | u8 status=ERROR | JSON {"error": code, "message": ...}

Responses come back in request order on each connection.
"""

from __future__ import annotations

import json
import struct

from runtime.errors import InvalidArgumentError, ScalableTopicsError, error_from_code

LENGTH = struct.Struct("!I")
_REQUEST = struct.Struct("!BH")
_SEQUENCE = struct.Struct("!q")
_OK = struct.Struct("!Bqq")
_OK_FRAME = struct.Struct("!IBqq")  # length prefix and body in one pack
OP_APPEND = 1
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


def encode_ok(base_offset: int, count: int) -> bytes:
    return _OK_FRAME.pack(_OK.size, STATUS_OK, base_offset, count)


def encode_error(error: ScalableTopicsError) -> bytes:
    body = bytes([STATUS_ERROR]) + json.dumps(error.to_dict()).encode()
    return LENGTH.pack(len(body)) + body


def decode_response(body: bytes) -> tuple[int, int]:
    """(base offset, count), or raise the typed error the segment reported."""
    if body[0] == STATUS_OK:
        _, base, count = _OK.unpack(body)
        return base, count
    data = json.loads(body[1:])
    raise error_from_code(data.get("error"), data.get("message", "data plane error"), 409)
