"""Spark pipeline: ingest events while the topic splits, aggregate them with Spark, verify.

Ingests N keyed events (default 1,000,000: 1,000 users, an amount each) into a
topic of two segments, splitting it twice while the producer has batches in
flight; then reads the whole segment DAG into Spark with ``read_topic`` and
computes the count and the sum of amounts per user. The result must equal what
was produced, user for user: it prints the biggest spenders as a table and
exits 1 on any mismatch. Deletes its topic at the end.

    .venv/bin/python examples/spark_pipeline.py [--events N]             # embedded local Ray
    ray job submit --working-dir . -- python examples/spark_pipeline.py  # a running cluster

``RAYTOPICS_PIPELINE_EVENTS`` sets the default of ``--events``. Needs Java 17.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

USERS = 1_000
CHUNK = 50_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_events = int(os.environ.get("RAYTOPICS_PIPELINE_EVENTS", "1000000"))
    parser.add_argument("--events", type=int, default=default_events)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from clients import ScalableTopicsAdmin
    from runtime import connect

    embedded = {} if "RAY_ADDRESS" in os.environ else {"include_dashboard": False}
    connect(log_to_driver=False, **embedded)
    admin = ScalableTopicsAdmin()
    topic = f"topic://pipeline/demo/payments-{uuid.uuid4().hex[:8]}"
    admin.create_scalable_topic(topic, num_segments=2)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as background:
            spark = background.submit(start_spark)  # JVMs boot while we ingest
            counts, sums = ingest(admin, topic, args.events)
            mismatches = aggregate_and_check(spark.result(), topic, counts, sums)
    finally:
        from clients.spark_session import stop_spark

        stop_spark()
        admin.delete_scalable_topic(topic)
        print(f"deleted {topic}", flush=True)
    if mismatches:
        print(f"spark_pipeline FAILED: {mismatches} users differ from what was produced")
        return 1
    print(f"spark_pipeline OK: {args.events} events, {USERS} users, counts and sums match")
    return 0


def ingest(admin, topic: str, events: int) -> tuple[np.ndarray, np.ndarray]:
    """Send the events in vectorized batches, splitting at 1/3 and 2/3 of the way."""
    from clients import Producer

    rng = np.random.default_rng(2024)
    names = pa.array([f"user-{u:04d}" for u in range(USERS)])
    counts = np.zeros(USERS, dtype=np.int64)
    sums = np.zeros(USERS, dtype=np.int64)
    splits = {events // 3: 0, 2 * events // 3: 1}
    started = time.perf_counter()
    with Producer(topic) as producer:
        for first in range(0, events, CHUNK):
            size = min(CHUNK, events - first)
            users = rng.integers(0, USERS, size)
            amounts = rng.integers(1, 1_000, size)
            values = pc.cast(pa.array(amounts.astype(str)), pa.binary())
            producer.send_batch(values, names.take(pa.array(users)))
            np.add.at(counts, users, 1)
            np.add.at(sums, users, amounts)
            for at, segment in splits.items():
                if first < at <= first + size:  # batches are still in flight: a live split
                    children = admin.split_segment(topic, segment)["children"]
                    print(f"split segment {segment} into {children} during ingestion", flush=True)
        producer.flush()
    seconds = time.perf_counter() - started
    print(f"ingested {events} events in {seconds:.1f}s ({events / seconds:,.0f}/s)", flush=True)
    return counts, sums


def start_spark() -> Any:
    """Spark on this Ray cluster, with its Python workers started and joined to Ray."""
    from clients.spark import warm_up
    from clients.spark_session import spark_session

    started = time.perf_counter()
    spark = spark_session("raytopics-pipeline")
    warm_up(spark)
    print(f"spark ready in {time.perf_counter() - started:.1f}s", flush=True)
    return spark


def aggregate_and_check(spark: Any, topic: str, counts: np.ndarray, sums: np.ndarray) -> int:
    """Per-user count and sum in Spark, compared with what was produced; prints a table."""
    from pyspark.sql import functions as F

    from clients.spark import read_topic

    started = time.perf_counter()
    events = read_topic(spark, topic)
    segments = sorted({r.segment_id for r in events.read_plan.ranges})
    print(f"reading segments {segments} of the DAG (epoch {events.read_plan.epoch})", flush=True)
    per_user = (
        events.withColumn("amount", F.col("value").cast("string").cast("long"))
        .groupBy("key")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("total"))
        .collect()
    )
    print(f"aggregated in Spark in {time.perf_counter() - started:.1f}s", flush=True)
    got = {row.key: (row.events, row.total) for row in per_user}
    expected = {f"user-{u:04d}": (int(counts[u]), int(sums[u])) for u in range(USERS) if counts[u]}
    mismatched = [
        user for user in expected.keys() | got.keys() if got.get(user) != expected.get(user)
    ]
    print_table(got, expected)
    return len(mismatched)


def print_table(got: dict[str, tuple[int, int]], expected: dict[str, tuple[int, int]]) -> None:
    top = sorted(expected, key=lambda user: expected[user][1], reverse=True)[:10]
    print(f"{'user':<10} {'events':>8} {'expected':>8} {'total':>10} {'expected':>10}  check")
    for user in top:
        (n, total), (want_n, want_total) = got.get(user, (0, 0)), expected[user]
        ok = "ok" if (n, total) == (want_n, want_total) else "MISMATCH"
        print(f"{user:<10} {n:>8} {want_n:>8} {total:>10} {want_total:>10}  {ok}")
    all_n, all_total = (sum(col) for col in zip(*got.values(), strict=True)) if got else (0, 0)
    want_n, want_total = (sum(col) for col in zip(*expected.values(), strict=True))
    print(f"{'ALL':<10} {all_n:>8} {want_n:>8} {all_total:>10} {want_total:>10}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
