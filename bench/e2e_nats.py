"""The NATS JetStream peer of the end-to-end benchmark: a persistent, acknowledged
streaming log a user might pick instead of this one.

One JetStream stream per "segment", file storage, its subjects ``e2e<n>.<i>.<key>``
(the key's Murmur3 hash picks stream ``i`` exactly as it picks our segment, and the
key rides in the subject, as NATS users address keys). Producers publish every message
of a batch with a reply inbox and wait for the server's acknowledgement of each
before the next batch (what ``js.publish`` does one message at a time, pipelined the
way the Go client's ``PublishAsync`` does). Consumers are one durable pull consumer
per stream (``AckPolicy.ALL``: the last message of a fetch acknowledges it, as our
``acknowledge_cumulative``), fetched concurrently from one asyncio loop per process.
Producers and consumers run in processes of their own, before Ray starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from functools import partial
from typing import Any

import numpy as np
from _common import NatsServer
from e2e_common import (
    SUBSCRIPTION,
    LatencyLog,
    PacedSends,
    Workload,
    run_peer_case,
    sample_rows,
    stamps_of,
)
from e2e_redis import redis_key_streams

FETCH_WAIT_S = 0.1


def _stream(n: int, i: int) -> str:
    return f"E2E{n}_{i}"


async def _reset_streams(url: str, n: int) -> None:
    """Fresh streams of ``n`` and their durable pull consumers."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url)
    js = nc.jetstream()
    for i in range(n):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(_stream(n, i))
        config = StreamConfig(
            name=_stream(n, i), subjects=[f"e2e{n}.{i}.*"], storage=StorageType.FILE
        )
        await js.add_stream(config)
        consumer = ConsumerConfig(
            durable_name=SUBSCRIPTION, ack_policy=AckPolicy.ALL, max_ack_pending=-1
        )
        await js.add_consumer(_stream(n, i), consumer)
    await nc.close()


def nats_producer(url: str, n: int, spec: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_produce(url, n, spec))


async def _produce(url: str, n: int, spec: dict[str, Any]) -> dict[str, Any]:
    import nats

    workload = Workload(spec["batch"], seed=spec["seed"], values=spec["values"])
    key_stream = redis_key_streams(workload, n)
    subjects = [f"e2e{n}.{int(key_stream[k])}.{name}" for k, name in enumerate(workload.key_names)]
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    inbox = f"_INBOX.{uuid.uuid4().hex}"
    state = {"owed": 0, "failed": 0}
    failed_batches = 0
    all_acked = asyncio.Event()

    async def on_ack(msg: Any) -> None:
        if msg.data.startswith(b'{"error"'):
            state["failed"] += 1
        state["owed"] -= 1
        if state["owed"] == 0:
            all_acked.set()

    await nc.subscribe(inbox, cb=on_ack)
    cpu = time.process_time()
    sends = PacedSends(spec, workload)
    for k, records in sends:
        count = len(records)
        data = records.tobytes()
        keys = workload.keys_index(k)[:count].tolist()
        all_acked.clear()
        state["owed"] += count
        failed_before = state["failed"]
        for i in range(count):
            await nc.publish(subjects[keys[i]], data[i * 100 : i * 100 + 100], reply=inbox)
        await all_acked.wait()
        failed_batches += state["failed"] > failed_before
    report = sends.report(time.time_ns(), time.process_time() - cpu)
    report["failed_batches"] = failed_batches
    await nc.close()
    return report


def nats_consumer(
    url: str, n: int, name: str, spec: dict[str, Any], stop: Any, received: Any
) -> dict[str, Any]:
    return asyncio.run(_consume(url, n, name, spec, stop, received))


async def _consume(
    url: str, n: int, name: str, spec: dict[str, Any], stop: Any, received: Any
) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    log, batch = LatencyLog(spec["measure_from_ns"]), spec["batch"]
    cpu = time.process_time()

    async def read(i: int) -> None:
        pull = await js.pull_subscribe_bind(SUBSCRIPTION, stream=_stream(n, i))
        while not stop.is_set():
            try:
                messages = await pull.fetch(batch, timeout=FETCH_WAIT_S)
            except (nats.errors.TimeoutError, TimeoutError):  # the client raises either
                continue
            if not messages:
                continue
            now = time.time_ns()
            await messages[-1].ack()
            rows = sample_rows(len(messages))
            stored = np.array(
                [int(messages[r].metadata.timestamp.timestamp() * 1e6) * 1000 for r in rows]
            )
            sent = stamps_of([messages[r].data for r in rows])
            log.add(stamps_of(m.data for m in messages), now, (sent, stored))
            with received.get_lock():
                received.value += len(messages)

    await asyncio.gather(*(read(i) for i in range(n)))
    await nc.close()
    return {"name": name, "cpu_s": time.process_time() - cpu, **log.snapshot(with_latencies=True)}


def run_nats_case(
    server: NatsServer, n: int, args: argparse.Namespace, rate: float | None, seconds: float
) -> dict[str, Any]:
    """One measurement: producers (processes) -> n streams -> pull consumers (processes)."""
    asyncio.run(_reset_streams(server.url, n))
    produce, consume = partial(nats_producer, server.url), partial(nats_consumer, server.url)
    return run_peer_case("nats", server.pid, n, args, rate, seconds, produce, consume)
