"""What a transaction costs, beside the same messages sent without one.

A topic of ``--segments`` (4) segments; for each transaction size in ``--sizes`` (1, 10,
100, 1,000 messages of 100 bytes, keys spread over every segment), ``--messages``
(20,000) messages are sent, in at most ``--max-transactions`` (200) transactions:

- ``txn``: one producer, in transactions of that size one after another, each
  committed (``Transaction.commit`` waits for its sends, then the coordinator writes a
  marker to every segment the transaction joined and records it finished). The
  commit latency is from ``commit()`` called to its return;
- ``plain``: then as many messages by the same producer without a transaction, then
  flushed: the peer.

msgs/s is sent messages over the wall time from the first send to the last flush or
commit. Every message of every round is then read back by a stream consumer, to check
that each committed message arrived once.

    .venv/bin/python bench/transactions.py                 # ~3 min
    .venv/bin/python bench/transactions.py --messages 5000 --sizes 10 100

Prints each row and writes bench/results/transactions.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import machine_info, report, write_report  # noqa: E402

RESULTS = Path(__file__).with_name("results") / "transactions.json"
VALUE = b"x" * 100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1_000])
    parser.add_argument("--max-transactions", type=int, default=200)
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args()


def plain(producer: Any, messages: int) -> dict[str, Any]:
    started = time.perf_counter()
    for i in range(messages):
        producer.send(VALUE, key=f"k{i % 997}")
    producer.flush()
    wall = time.perf_counter() - started
    return {"mode": "plain", "messages": messages, "msgs_per_s": round(messages / wall)}


def transactional(admin: Any, producer: Any, messages: int, size: int, most: int) -> dict[str, Any]:
    commits: list[float] = []
    count = max(1, min(messages // size, most))
    started = time.perf_counter()
    for t in range(count):
        txn = admin.new_transaction()
        for i in range(size):
            producer.send(VALUE, key=f"k{(t * size + i) % 997}", txn=txn)
        asked = time.perf_counter()
        txn.commit()
        commits.append((time.perf_counter() - asked) * 1000)
    wall = time.perf_counter() - started
    commits.sort()
    return {
        "mode": "txn",
        "size": size,
        "transactions": count,
        "messages": count * size,
        "msgs_per_s": round(count * size / wall),
        "commit_ms_p50": round(statistics.median(commits), 1),
        "commit_ms_p99": round(commits[min(len(commits) - 1, int(len(commits) * 0.99))], 1),
    }


def read_back(topic: str, expected: int) -> int:
    from clients import StreamConsumer

    received = 0
    with StreamConsumer(topic, "check", "bench") as consumer:
        while received < expected:
            batch = consumer.receive_batch(5_000, timeout=10.0)
            if not batch:
                break
            consumer.acknowledge_cumulative(batch)
            received += len(batch)
    return received


def main() -> int:
    args = parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", tempfile.mkdtemp(prefix="txn-bench-"))
    from clients import Producer, ScalableTopicsAdmin
    from runtime import connect

    connect(None, log_to_driver=False)
    info, started = machine_info(), time.perf_counter()
    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/txn/t{os.getpid()}"
    admin.create_scalable_topic(topic, args.segments)
    admin.wait_until_ready(topic)
    admin.create_subscription(topic, "check", "earliest")
    rows: list[dict[str, Any]] = []
    with Producer(topic) as producer:
        plain(producer, 1_000)  # connections and lookups made before anything is timed
        sent = 1_000
        for size in args.sizes:
            txn = transactional(admin, producer, args.messages, size, args.max_transactions)
            peer = {"size": size, **plain(producer, txn["messages"])}
            for row in (peer, txn):
                rows.append(row)
                sent += row["messages"]
                print(row, flush=True)
    received = read_back(topic, sent)
    print(f"read back {received} of {sent}")
    admin.delete_scalable_topic(topic)
    settings = {k: getattr(args, k) for k in ("segments", "messages", "sizes")}
    write_report(
        args.results,
        report(
            "transactions", started, info, settings=settings, rows=rows,
            sent=sent, read_back=received,
        ),
    )  # fmt: skip
    return 0 if received == sent else 1


if __name__ == "__main__":
    sys.exit(main())
