"""Key hashing: Murmur3 x86 32-bit, seed 0, over UTF-8 bytes.

Its low 16 bits decide which segment owns a key, so they must be identical in every
process and language: the scalar path uses the maintained ``mmh3`` C library,
and the vectorized path (for whole columns from Spark or Ray Data) is a NumPy
transcription of the same algorithm, checked against ``mmh3`` in the tests.

Its high 16 bits pick the key's *bucket* inside its segment (as Pulsar's key-shared
buckets do), independent of where the segment's hash range starts and ends: the
consumers of a key-shared stream subscription each own whole buckets of a segment
(``runtime.assignment``), and a key's bucket is the same in every segment it passes
through.
"""

from __future__ import annotations

import mmh3
import numpy as np
import pyarrow as pa

HASH_MASK = 0xFFFF

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def murmur3_32(data: bytes, seed: int = 0) -> int:
    return mmh3.hash(data, seed, signed=False)


def key_hash(key: str | bytes) -> int:
    """The 16-bit routing hash of one key."""
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return mmh3.hash(data, 0, signed=False) & HASH_MASK


def key_hashes(keys: pa.Array | list[str | None]) -> np.ndarray:
    """Routing hashes of a whole column; null keys get -1.

    Works block-by-block across all keys at once, so its Python-level loop runs
    once per 4 bytes of the longest key, never once per message.
    """
    keys = _as_binary(keys)
    result = (_murmur3_of(keys) & np.uint32(HASH_MASK)).astype(np.int32)
    if keys.null_count:
        result[np.asarray(keys.is_null())] = -1
    return result


def key_buckets(keys: pa.Array, buckets: int, offsets: np.ndarray) -> np.ndarray:
    """Each key's bucket of ``buckets``, from its hash's high 16 bits: bucket ``b`` holds
    the keys whose high bits fall in ``[b * 65536 / buckets, (b + 1) * 65536 / buckets)``.
    A message without a key has no order to keep: its bucket follows its offset, so
    each one goes to exactly one share."""
    keys = _as_binary(keys)
    result = ((_murmur3_of(keys) >> np.uint32(16)).astype(np.int64) * buckets) >> 16
    if keys.null_count:
        nulls = np.asarray(keys.is_null())
        result[nulls] = np.asarray(offsets, dtype=np.int64)[nulls] % buckets
    return result


def key_bucket(key: str | bytes | None, buckets: int, offset: int) -> int:
    """``key_buckets`` of one message."""
    if key is None:
        return offset % buckets
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return ((mmh3.hash(data, 0, signed=False) >> 16) * buckets) >> 16


def _murmur3_of(keys: pa.BinaryArray) -> np.ndarray:
    """The whole 32-bit hash of every key of a binary column."""
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[
        keys.offset : keys.offset + len(keys) + 1
    ]
    starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets).astype(np.int64)
    raw = keys.buffers()[2]
    data = np.frombuffer(raw, dtype=np.uint8) if raw is not None else np.zeros(0, np.uint8)
    return _murmur3_columns(np.concatenate([data, np.zeros(4, np.uint8)]), starts, lengths)


def _as_binary(keys: pa.Array | list[str | None]) -> pa.BinaryArray:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        keys = pa.array(keys, type=pa.string())
    if pa.types.is_large_string(keys.type) or pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.string() if pa.types.is_large_string(keys.type) else pa.binary())
    return keys.view(pa.binary()) if pa.types.is_string(keys.type) else keys


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _load_u32(data: np.ndarray, pos: np.ndarray) -> np.ndarray:
    b = [data[pos + i].astype(np.uint32) for i in range(4)]
    return b[0] | (b[1] << np.uint32(8)) | (b[2] << np.uint32(16)) | (b[3] << np.uint32(24))


def _mix_k(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _murmur3_columns(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    h = np.zeros(len(starts), dtype=np.uint32)
    nblocks = lengths // 4
    for block in range(int(nblocks.max(initial=0))):
        rows = np.nonzero(nblocks > block)[0]
        k = _mix_k(_load_u32(data, starts[rows] + 4 * block))
        hb = _rotl(h[rows] ^ k, 13)
        h[rows] = hb * np.uint32(5) + np.uint32(0xE6546B64)
    tail_len = lengths & 3
    rows = np.nonzero(tail_len)[0]
    if len(rows):
        tail = _load_u32(data, starts[rows] + 4 * nblocks[rows])
        keep = (np.uint32(1) << (8 * tail_len[rows]).astype(np.uint32)) - np.uint32(1)
        h[rows] ^= _mix_k(tail & keep)
    h ^= lengths.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h
