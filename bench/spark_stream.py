"""Spark streaming read throughput: an ``AvailableNow`` query of the raytopics source
against ``read_topic`` and ``spark.read.parquet`` of the same rows, in one run.

Produces N 100-byte records (default 2,000,000) under 100,000 keys into a topic
of 8 segments (as ``spark_read.py``), writes the rows to Parquet, then times,
alternating and after one untimed pass of each: a streaming query
(``readStream.format("raytopics")``, ``Trigger.AvailableNow``, a fresh checkpoint
each run) into Spark's ``noop`` sink, a ``read_topic`` snapshot and a Parquet
scan, each materializing every column. The streaming source reads segments over
their data planes in the JVM; ``read_topic`` goes through Python workers.

    .venv/bin/python bench/spark_stream.py [--records 2000000] [--runs 3]

Writes bench/results/spark_stream.json. Needs Java 17 (Spark on Ray via RayDP).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_read import produce

RESULTS = Path(__file__).parent / "results" / "spark_stream.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-stream-"))
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", str(scratch / "segments"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("RAYTOPICS_DURABILITY", "none")  # ingest speed is not measured here

    from clients import ScalableTopicsAdmin
    from clients.spark import read_topic
    from clients.spark_session import spark_session, stop_spark
    from runtime import connect, disconnect

    connect(include_dashboard=False, log_to_driver=False)
    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/spark/stream-{int(time.time())}"
    admin.create_scalable_topic(topic, args.segments)
    try:
        produce(topic, args.records)
        spark = spark_session("bench-spark-stream")
        parquet = str(scratch / "parquet")
        read_topic(spark, topic).write.mode("overwrite").parquet(parquet)
        runs = measure(spark, topic, parquet, scratch, args.records, args.runs)
        report = summarize(args, runs)
    finally:
        stop_spark()
        admin.delete_scalable_topic(topic)
        disconnect()  # leaves the embedded Ray whose metadata is under the scratch directory
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def measure(
    spark: Any, topic: str, parquet: str, scratch: Path, records: int, runs: int
) -> dict[str, list]:
    from clients.spark import read_topic

    def stream(run: int) -> None:
        query = (
            spark.readStream.format("raytopics")
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(scratch / f"checkpoint-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        read = sum(p["numInputRows"] for p in query.recentProgress)
        assert read == records, f"the streaming query read {read} of {records} rows"

    scans = {
        "stream_available_now": stream,
        "read_topic": lambda run: (
            read_topic(spark, topic).write.format("noop").mode("overwrite").save()
        ),
        "parquet": lambda run: (
            spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()
        ),
    }
    results: dict[str, list] = {name: [] for name in scans}
    for run in range(runs + 1):
        for name, scan in scans.items():
            started = time.perf_counter()
            scan(run)
            seconds = time.perf_counter() - started
            label = "warm-up" if run == 0 else f"run {run}"
            print(f"{name} {label}: {records / seconds:,.0f} rows/s ({seconds:.2f}s)", flush=True)
            if run:
                rate = round(records / seconds)
                results[name].append({"seconds": round(seconds, 3), "rows_per_s": rate})
    return results


def summarize(args: argparse.Namespace, runs: dict) -> dict[str, Any]:
    rates = {name: [r["rows_per_s"] for r in rows] for name, rows in runs.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "records": args.records,
        "segments": args.segments,
        "runs": runs,
        "best_rows_per_s": {k: max(v) for k, v in rates.items()},
        "median_rows_per_s": {k: round(v) for k, v in median.items()},
        "stream_to_read_topic": round(median["stream_available_now"] / median["read_topic"], 3),
        "stream_to_parquet": round(median["stream_available_now"] / median["parquet"], 3),
        "goal_stream_to_read_topic": 1.0,
    }


if __name__ == "__main__":
    main()
