"""The Redis Streams peer of the end-to-end benchmark: one stream per "segment" (the
key's Murmur3 hash picks the stream exactly as it picks our segment), XADD in one
redis-py pipeline per batch, a consumer group read with XREADGROUP (COUNT = batch) +
XACK; producers and consumers in processes of their own."""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import Any

import numpy as np
from _common import RedisServer
from e2e_common import (
    KEYS,
    SUBSCRIPTION,
    LatencyLog,
    PacedSends,
    Workload,
    run_peer_case,
    sample_rows,
    stamps_of,
)


def redis_streams(n: int) -> list[str]:
    return [f"bench-{n}-{i}" for i in range(n)]


def redis_key_streams(workload: Workload, n: int) -> np.ndarray:
    """Stream index of every key: the segment our initial layout of ``n`` gives it."""
    from runtime.hashing import key_hashes
    from runtime.layout import SegmentLayout
    from runtime.routing import partition

    hashes = key_hashes(workload.key_names)
    stream = np.zeros(KEYS, dtype=np.int64)
    layout = SegmentLayout.initial(n)
    for segment_id, rows in partition(layout, hashes, 0).groups.items():
        stream[rows] = segment_id
    return stream


def redis_producer(port: int, n: int, spec: dict[str, Any]) -> dict[str, Any]:
    import redis

    workload = Workload(spec["batch"], seed=spec["seed"], values=spec["values"])
    streams = redis_streams(n)
    key_stream = redis_key_streams(workload, n)
    names = [s.encode() for s in streams]
    client = redis.Redis(host="127.0.0.1", port=port)
    client.ping()
    cpu = time.process_time()
    sends = PacedSends(spec, workload)
    for k, records in sends:
        count = len(records)
        data = records.tobytes()
        keys = workload.keys_index(k)[:count]
        targets, keys = key_stream[keys].tolist(), keys.tolist()
        key_names = workload.key_names
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            pipe.xadd(
                names[targets[i]], {b"k": key_names[keys[i]], b"v": data[i * 100 : i * 100 + 100]}
            )
        pipe.execute()
    client.close()
    return sends.report(time.time_ns(), time.process_time() - cpu)


def redis_consumer(
    port: int,
    n: int,
    name: str,
    spec: dict[str, Any],
    stop: Any,
    received: Any,
) -> dict[str, Any]:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    streams = {s: ">" for s in redis_streams(n)}
    log, batch = LatencyLog(spec["measure_from_ns"]), spec["batch"]
    cpu = time.process_time()
    while not stop.is_set():
        reply = client.xreadgroup(SUBSCRIPTION, name, streams, count=batch, block=100)
        if not reply:
            continue
        now = time.time_ns()
        values: list[bytes] = []
        all_ids: list[bytes] = []
        pipe = client.pipeline(transaction=False)
        for stream, entries in reply:
            ids = []
            for entry_id, fields in entries:
                ids.append(entry_id)
                values.append(fields[b"v"])
            pipe.xack(stream, SUBSCRIPTION, *ids)
            all_ids.extend(ids)
        pipe.execute()
        rows = sample_rows(len(values))
        stored = np.array([int(all_ids[i].split(b"-")[0]) * 1_000_000 for i in rows])
        sent = stamps_of([values[i] for i in rows])
        log.add(stamps_of(values), now, (sent, stored))
        with received.get_lock():
            received.value += len(values)
    snap = log.snapshot(with_latencies=True)
    client.close()
    return {"name": name, "cpu_s": time.process_time() - cpu, **snap}


def run_redis_case(
    server: RedisServer, n: int, args: argparse.Namespace, rate: float | None, seconds: float
) -> dict[str, Any]:
    """One measurement: producers (processes) -> n streams -> consumer group (processes)."""
    import redis

    port, server_pid = server.port, server.pid
    client = redis.Redis(host="127.0.0.1", port=port)
    for stream in redis_streams(n):
        client.delete(stream)
        client.xgroup_create(stream, SUBSCRIPTION, id="0", mkstream=True)
    produce, consume = partial(redis_producer, port), partial(redis_consumer, port)
    found = run_peer_case("redis", server_pid, n, args, rate, seconds, produce, consume)
    for stream in redis_streams(n):
        client.delete(stream)
    client.close()
    return found
