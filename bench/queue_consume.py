"""What a queue consumer delivers, beside a stream consumer reading the same messages.

A topic of ``--segments`` (4) segments holds ``--messages`` (100,000) keyed messages,
written before anything reads. Each reader then takes all of them from a subscription
of its own, acknowledging as it goes, and the time from its start to its last message
is its rate:

- ``stream``: a ``StreamConsumer`` in this Ray driver (``receive_batch`` and a
  cumulative ack per batch): the peer, the ordered reader of the same data plane;
- ``queue``: a ``QueueConsumer`` in this Ray driver (``receive`` and an individual ack
  per message, as a work queue's worker does);
- ``queue-remote``: a ``QueueConsumer(url=...)`` through a gateway this run starts, in
  this process (its messages over the data plane, its layout from the gateway).

The CPU is this process's (the client's) and the Ray processes' (the segments', the
coordinator's, the gateway's, this program's Ray only), read before and after each reader.

    .venv/bin/python bench/queue_consume.py                  # 2 rounds, ~3 min
    .venv/bin/python bench/queue_consume.py --rounds 1 --messages 20000

Prints each round and writes bench/results/queue_consume.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import free_port, machine_info, report, write_report  # noqa: E402
from capacity import cluster_processes  # noqa: E402

READERS = ("stream", "queue", "queue-remote")
RESULTS = Path(__file__).with_name("results") / "queue_consume.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--readers", nargs="+", choices=READERS, default=list(READERS))
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args()


def cluster_cpu_s() -> float:
    """CPU seconds of this Ray's processes (``capacity.cluster_processes``) so far."""
    total = 0.0
    for process in cluster_processes():
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def client_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def read_all(reader: str, topic: str, url: str, expected: int) -> int:
    """Take ``expected`` messages with ``reader``; returns how many came."""
    from clients import QueueConsumer, StreamConsumer

    received = 0
    if reader == "stream":
        with StreamConsumer(topic, "stream", "bench") as consumer:
            while received < expected:
                batch = consumer.receive_batch(5_000, timeout=5.0)
                if not batch:
                    break
                consumer.acknowledge_cumulative(batch)
                received += len(batch)
        return received
    remote = {"url": url} if reader == "queue-remote" else {}
    with QueueConsumer(topic, reader, "bench", receive_batch=1_000, **remote) as consumer:
        while received < expected:
            message = consumer.receive(timeout=5.0)
            if message is None:
                break
            consumer.acknowledge(message)
            received += 1
    return received


def one_round(args: argparse.Namespace, url: str, number: int) -> list[dict[str, Any]]:
    from clients import Producer, ScalableTopicsAdmin

    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/queue/r{number}-{os.getpid()}"
    admin.create_scalable_topic(topic, args.segments)
    for subscription in args.readers:
        admin.create_subscription(topic, subscription, "earliest")
    with Producer(topic) as producer:
        for i in range(args.messages):
            producer.send(b"x" * 100, key=f"k{i % 1_000}")
    results = []
    for reader in args.readers:
        cluster, client, started = cluster_cpu_s(), client_cpu_s(), time.perf_counter()
        received = read_all(reader, topic, url, args.messages)
        wall = time.perf_counter() - started
        results.append(
            {
                "reader": reader,
                "received": received,
                "wall_s": round(wall, 2),
                "msgs_per_s": round(received / wall),
                "client_cpu_s": round(client_cpu_s() - client, 2),
                "cluster_cpu_s": round(cluster_cpu_s() - cluster, 2),
            }
        )
        print(results[-1], flush=True)
    admin.delete_scalable_topic(topic)
    return results


def median_of(rounds: list[dict[str, Any]], reader: str) -> dict[str, float]:
    mine = [r for r in rounds if r["reader"] == reader]
    fields = ("msgs_per_s", "client_cpu_s", "cluster_cpu_s")
    return {field: round(statistics.median(r[field] for r in mine), 2) for field in fields}


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="queue-bench-"))
    from actors.gateway.server import start_gateway, stop_gateway
    from runtime import connect

    connect(None, log_to_driver=False)
    info, started = machine_info(), time.perf_counter()
    port = free_port()
    url = start_gateway(port)
    rounds: list[dict[str, Any]] = []
    try:
        for number in range(args.rounds):
            rounds += one_round(args, url, number)
    finally:
        stop_gateway(port)
    summary = {reader: median_of(rounds, reader) for reader in args.readers}
    for reader, figures in summary.items():
        print(f"{reader:>13}: {figures}")
    settings = {k: getattr(args, k) for k in ("segments", "messages", "rounds", "readers")}
    write_report(
        args.results,
        report("queue_consume", started, info, settings=settings, rounds=rounds, median=summary),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
