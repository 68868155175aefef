"""Spark read throughput: ``read_topic`` against ``spark.read.parquet`` of the same rows.

Produces N 100-byte records (default 5,000,000) with 100,000 distinct keys into
a topic of 8 segments, writes exactly the rows ``read_topic`` returns to Parquet
with Spark (the ceiling: Spark's own vectorized columnar reader), then times
full scans of both in the same Spark session, alternating, each run forced to
materialize every column (``write.format("noop")``; a ``count()`` would let
Parquet skip the data), after one untimed pass of each. Rows per second per run;
the best and the median go in the JSON.

With ``--tiered`` every segment is split once the records are in, so all of them are
in sealed segments, and the topic's tiering policy (a ``file://`` tier, ``afterS`` 0)
moves those to the tier; once every one hibernates, ``read_topic`` reads them as a
Parquet scan of the tier's files, against the same ceiling.

    .venv/bin/python bench/spark_read.py [--records 5000000] [--runs 3] [--tiered]

Writes bench/results/spark_read.json (``spark_read_tiered.json`` with ``--tiered``).
Needs Java 17 (Spark on Ray via RayDP).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

RESULTS = Path(__file__).parent / "results" / "spark_read.json"
TIERED_RESULTS = Path(__file__).parent / "results" / "spark_read_tiered.json"
VALUE_BYTES = 100
DISTINCT_KEYS = 100_000
PRODUCE_CHUNK = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--executor-cores", type=int, default=1)
    parser.add_argument("--tiered", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.out = args.out or (TIERED_RESULTS if args.tiered else RESULTS)
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    if args.tiered:
        os.environ["RAYTOPICS_TIER_URIS"] = f"file://{scratch / 'tier'}/"
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", str(scratch / "segments"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("RAYTOPICS_DURABILITY", "none")  # ingest speed is not measured here

    from clients import ScalableTopicsAdmin
    from clients.spark import read_topic
    from clients.spark_session import spark_session, stop_spark
    from runtime import connect

    connect(include_dashboard=False, log_to_driver=False)
    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/spark/read-{int(time.time())}"
    admin.create_scalable_topic(topic, args.segments)
    try:
        produce_seconds = produce(topic, args.records)
        if args.tiered:
            move_all_to_tier(admin, topic, f"file://{scratch / 'tier'}/read")
        spark = spark_session("bench-spark-read", executor_cores=args.executor_cores)
        parquet = str(scratch / "parquet")
        read_topic(spark, topic).write.mode("overwrite").parquet(parquet)
        runs = measure(spark, topic, parquet, args.records, args.runs)
        executors = int(spark.conf.get("spark.executor.instances"))
        report = summarize(args, produce_seconds, runs, executors)
    finally:
        stop_spark()
        admin.delete_scalable_topic(topic)
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def produce(topic: str, records: int) -> float:
    """N records of 100 random bytes under 100k keys, sent as vectorized batches."""
    from clients import Producer

    rng = np.random.default_rng(7)
    started = time.perf_counter()
    with Producer(topic, batch_max_records=10_000) as producer:
        for low in range(0, records, PRODUCE_CHUNK):
            count = min(PRODUCE_CHUNK, records - low)
            ids = rng.integers(0, DISTINCT_KEYS, count)
            keys = pa.array([f"user-{i}" for i in ids.tolist()], pa.string())
            values = rng.integers(0, 256, count * VALUE_BYTES, dtype=np.uint8).tobytes()
            offsets = pa.array(np.arange(0, (count + 1) * VALUE_BYTES, VALUE_BYTES, np.int32))
            value_array = pa.BinaryArray.from_buffers(
                pa.binary(), count, [None, offsets.buffers()[1], pa.py_buffer(values)]
            )
            producer.send_batch(value_array, keys)
        producer.flush()
    return time.perf_counter() - started


def move_all_to_tier(admin: Any, topic: str, uri: str) -> None:
    """Seal every segment (a split each) and wait until the tier holds them all and their
    actors have exited."""
    for segment_id in sorted(admin.get_layout(topic).active_segments):
        admin.split_segment(topic, segment_id)
    admin.set_policy(topic, {"tiering": {"uri": uri, "afterS": 0, "idleS": 1}})
    deadline = time.monotonic() + 600
    while True:
        segments = admin.get_stats(topic)["segments"].values()
        sealed = [s for s in segments if s["state"] == "SEALED"]
        if all(s["hibernating"] for s in sealed):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"segments not tiered after 10 minutes: {sealed}")
        time.sleep(1)


def measure(spark: Any, topic: str, parquet: str, records: int, runs: int) -> dict[str, list]:
    """One untimed pass of each scan (JIT, page cache), then timed runs, alternating the
    two scans so that load from other processes hits both alike."""
    from clients.spark import read_topic

    scans = {
        "read_topic": lambda: read_topic(spark, topic),
        "parquet": lambda: spark.read.parquet(parquet),
    }
    results: dict[str, list] = {name: [] for name in scans}
    for run in range(runs + 1):
        for name, scan in scans.items():
            started = time.perf_counter()
            scan().write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
            label = "warm-up" if run == 0 else f"run {run}"
            print(f"{name} {label}: {records / seconds:,.0f} rows/s ({seconds:.2f}s)", flush=True)
            if run:
                rate = round(records / seconds)
                results[name].append({"seconds": round(seconds, 3), "rows_per_s": rate})
    return results


def summarize(
    args: argparse.Namespace, produce_seconds: float, runs: dict, executors: int
) -> dict[str, Any]:
    rates = {name: [r["rows_per_s"] for r in rows] for name, rows in runs.items()}
    best = {name: max(values) for name, values in rates.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": os.getloadavg(),
        },
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "segments": args.segments,
        "spark": {"executors": executors, "executor_cores": args.executor_cores},
        "produce_rows_per_s": round(args.records / produce_seconds),
        "runs": runs,
        "best_rows_per_s": {k: round(v) for k, v in best.items()},
        "median_rows_per_s": {k: round(v) for k, v in median.items()},
        "ratio_to_parquet": {
            "best": round(best["read_topic"] / best["parquet"], 3),
            "median": round(median["read_topic"] / median["parquet"], 3),
        },
        "tiered": args.tiered,
        "target_ratio": 1.0 if args.tiered else 0.5,
    }


if __name__ == "__main__":
    main()
