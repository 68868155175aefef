"""Spark write throughput: ``write_topic`` against ``df.write.parquet`` of the same rows.

Builds N rows (default 2,000,000) of a key among 100,000 and a 100-byte value in
Spark, cached, then times writing them alternately to a fresh topic of 8 segments
with ``write_topic`` (each chunk stored once through the cluster's idempotent-write
records, appended by the tasks over the segments' data planes) and to Parquet with
Spark's own writer (the ceiling: a local columnar file write), after one untimed
pass of each. Rows per second per run; the median and the ratio go in the JSON.

    .venv/bin/python bench/spark_write.py [--records 2000000] [--runs 3]

Writes bench/results/spark_write.json. Needs Java 17 (Spark on Ray via RayDP).
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
import uuid
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "spark_write.json"
VALUE_BYTES = 100
DISTINCT_KEYS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-write-"))
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", str(scratch / "segments"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from clients.admin import ScalableTopicsAdmin
    from clients.spark import write_topic
    from clients.spark_session import spark_session, stop_spark
    from runtime import connect, disconnect

    connect()
    spark = spark_session("bench-spark-write")
    admin = ScalableTopicsAdmin()
    rows = spark.range(0, args.records, numPartitions=args.partitions).selectExpr(
        f"concat('key-', cast(id % {DISTINCT_KEYS} as string)) as key",
        f"cast(repeat('x', {VALUE_BYTES}) as binary) as value",
    )
    rows = rows.cache()
    rows.count()

    def to_topic() -> float:
        topic = f"topic://bench/spark-write/t-{uuid.uuid4().hex[:8]}"
        admin.create_scalable_topic(topic, args.segments)
        admin.wait_until_ready(topic)
        started = time.perf_counter()
        assert write_topic(rows, topic).rows == args.records
        elapsed = time.perf_counter() - started
        admin.delete_scalable_topic(topic)
        return elapsed

    def to_parquet() -> float:
        path = scratch / f"parquet-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        rows.write.parquet(str(path))
        elapsed = time.perf_counter() - started
        shutil.rmtree(path, ignore_errors=True)
        return elapsed

    to_topic(), to_parquet()  # untimed: workers started, JIT warm
    runs: dict[str, list[float]] = {"write_topic": [], "parquet": []}
    for _ in range(args.runs):
        runs["write_topic"].append(args.records / to_topic())
        runs["parquet"].append(args.records / to_parquet())
    stop_spark()
    disconnect()  # leaves the embedded Ray whose metadata is under the scratch directory
    shutil.rmtree(scratch, ignore_errors=True)
    report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) for name, values in runs.items()}
    result: dict[str, Any] = {
        "records": args.records,
        "segments": args.segments,
        "partitions": args.partitions,
        "value_bytes": VALUE_BYTES,
        "rows_per_s": {name: [round(v) for v in values] for name, values in runs.items()},
        "median_rows_per_s": {name: round(v) for name, v in medians.items()},
        "write_topic_vs_parquet": round(medians["write_topic"] / medians["parquet"], 2),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
