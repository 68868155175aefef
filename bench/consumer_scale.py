"""Consumption that scales past the segment count: a stream subscription's consumers
sharing segments by key bucket, beside the same consumers without sharing and a queue
subscription's consumers, on the same topic in the same run.

A topic of ``--segments`` (4) segments holds ``--messages`` (120,000) messages over
1,000 keys, written before anything reads. For each consumer count (1, 4, 8, 16) and
each kind, that many consumers (threads of this Ray driver) join a subscription of
their own created at the earliest offset and handle every message at ``--handler-ms``
(1 ms, a ``time.sleep``: work that waits, as a call to another service does), then
acknowledge it. After ``--warmup-s`` (3 s) for the assignment to settle, the messages
handled over ``--window-s`` (8 s) are the rate.

- ``key-shared``: ``StreamConsumer``s, the topic's default bucket budget (256): past
  one consumer a segment, each holds a run of a segment's key buckets, per-key order kept;
- ``segments-only``: ``StreamConsumer``s on a topic whose policy turns sharing off
  (``keyShared.buckets`` 1): a consumer per segment, the rest wait, as a Kafka group's
  consumers past its partitions (the product before key-shared reading);
- ``queue``: ``QueueConsumer``s, each message to any consumer, no order: the peer
  that scales with consumers by giving order up.

    .venv/bin/python bench/consumer_scale.py                  # ~4 min
    .venv/bin/python bench/consumer_scale.py --counts 4 16 --window-s 5

Prints each run and writes bench/results/consumer_scale.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine_info, report, write_report  # noqa: E402

KINDS = ("key-shared", "segments-only", "queue")
RESULTS = Path(__file__).with_name("results") / "consumer_scale.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--messages", type=int, default=120_000)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--handler-ms", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args()


class Worker:
    """One consumer on a thread: handle, then acknowledge, each message."""

    def __init__(self, kind: str, topic: str, subscription: str, name: str, handler_s: float):
        from clients import QueueConsumer, StreamConsumer

        if kind == "queue":
            self.consumer: Any = QueueConsumer(topic, subscription, name, receive_batch=100)
        else:
            self.consumer = StreamConsumer(topic, subscription, name, receiver_queue_size=500)
        self.kind, self.handler_s, self.handled = kind, handler_s, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.kind == "queue":
                message = self.consumer.receive(timeout=0.2)
                batch = [] if message is None else [message]
            else:
                batch = self.consumer.receive_batch(20, timeout=0.2)
            for message in batch:
                time.sleep(self.handler_s)
                if self.kind == "queue":
                    self.consumer.acknowledge(message)
                else:
                    self.consumer.acknowledge_cumulative(message)
                self.handled += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.consumer.close()


def one_run(args: argparse.Namespace, kind: str, topic: str, count: int) -> dict[str, Any]:
    from clients import ScalableTopicsAdmin

    subscription = f"{kind}-{count}"
    ScalableTopicsAdmin().create_subscription(topic, subscription, "earliest")
    workers = [
        Worker(kind, topic, subscription, f"c{i}", args.handler_ms / 1000) for i in range(count)
    ]
    try:
        time.sleep(args.warmup_s)
        before, started = [w.handled for w in workers], time.perf_counter()
        time.sleep(args.window_s)
        after, wall = [w.handled for w in workers], time.perf_counter() - started
    finally:
        for worker in workers:
            worker.close()
    per_consumer = [b - a for a, b in zip(before, after, strict=True)]
    result = {
        "kind": kind,
        "consumers": count,
        "msgs_per_s": round(sum(per_consumer) / wall),
        "reading": sum(1 for n in per_consumer if n),
        "per_consumer_msgs_per_s": [round(n / wall) for n in per_consumer],
    }
    print(result, flush=True)
    return result


def fill(args: argparse.Namespace, kind: str) -> str:
    from clients import Producer, ScalableTopicsAdmin

    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/consumers/{kind}-{os.getpid()}"
    admin.create_scalable_topic(topic, args.segments)
    if kind == "segments-only":
        admin.set_policy(topic, {"keyShared": {"buckets": 1}})
    with Producer(topic) as producer:
        for i in range(args.messages):
            producer.send(b"x" * 100, key=f"k{i % 1_000}")
    return topic


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="consumer-bench-"))
    from clients import ScalableTopicsAdmin
    from runtime import connect

    connect(None, log_to_driver=False)
    info, started = machine_info(), time.perf_counter()
    runs: list[dict[str, Any]] = []
    for kind in args.kinds:
        topic = fill(args, kind)
        runs += [one_run(args, kind, topic, count) for count in args.counts]
        ScalableTopicsAdmin().delete_scalable_topic(topic)
    table = {
        kind: {r["consumers"]: r["msgs_per_s"] for r in runs if r["kind"] == kind}
        for kind in args.kinds
    }
    for kind, rates in table.items():
        print(f"{kind:>14}: " + "  ".join(f"{n}: {rate:,}/s" for n, rate in rates.items()))
    settings = {
        k: getattr(args, k)
        for k in ("segments", "messages", "counts", "kinds", "handler_ms", "warmup_s", "window_s")
    }
    write_report(
        args.results,
        report("consumer_scale", started, info, settings=settings, runs=runs, msgs_per_s=table),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
