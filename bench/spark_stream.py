"""Spark streaming throughput, read and write: an ``AvailableNow`` query of the raytopics
source against ``read_topic`` and ``spark.read.parquet`` of the same rows, and the
raytopics streaming sink against ``write_topic`` and ``df.write.parquet``, in one run.

Produces N 100-byte records (default 2,000,000) under 100,000 keys into a topic
of 8 segments (as ``spark_read.py``), writes the rows to Parquet, then times,
alternating and after one untimed pass of each: a streaming query
(``readStream.format("raytopics")``, ``Trigger.AvailableNow``, a fresh checkpoint
each run) into Spark's ``noop`` sink, a ``read_topic`` snapshot and a Parquet
scan, each materializing every column. The streaming source reads segments over
their data planes in the JVM; ``read_topic`` goes through Python workers.

Then the writes, alternating the same way, each taking the key and value columns of
that Parquet copy: a streaming query reading the files (``readStream.parquet``,
``Trigger.AvailableNow``) into the raytopics sink of a fresh topic of as many
segments (the JVM's tasks append over the data plane after the cluster records each
chunk), ``write_topic`` of the same files into a fresh topic (Python tasks, the
same protocol), and ``df.write.parquet`` of them. Each topic write is checked whole
(the topic's record count) before the topic is deleted, outside the timing.

    .venv/bin/python bench/spark_stream.py [--records 2000000] [--runs 3]
        [--writes-only] [--connector-jar JAR]

``--connector-jar`` runs Spark with another build of the connector (an earlier commit's,
built with ``java/build.sh``) against this cluster, to compare its sink in the same hour.

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
    parser.add_argument("--writes-only", action="store_true", help="time the writes alone")
    parser.add_argument("--connector-jar", type=Path, help="the connector jar Spark loads")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-stream-"))
    os.environ.setdefault("RAYTOPICS_STORAGE_ROOT", str(scratch / "segments"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("RAYTOPICS_DURABILITY", "none")  # ingest speed is not measured here

    from clients import ScalableTopicsAdmin
    from clients import spark_session as session_module
    from clients.spark import read_topic
    from clients.spark_session import spark_session, stop_spark
    from runtime import connect, disconnect

    if args.connector_jar is not None:
        jar = str(args.connector_jar.resolve())
        session_module.connector_jar = lambda: jar

    connect(include_dashboard=False, log_to_driver=False)
    admin = ScalableTopicsAdmin()
    topic = f"topic://bench/spark/stream-{int(time.time())}"
    admin.create_scalable_topic(topic, args.segments)
    try:
        produce(topic, args.records)
        spark = spark_session("bench-spark-stream")
        parquet = str(scratch / "parquet")
        read_topic(spark, topic).write.mode("overwrite").parquet(parquet)
        runs = (
            {}
            if args.writes_only
            else measure(spark, topic, parquet, scratch, args.records, args.runs)
        )
        runs |= measure_writes(spark, admin, parquet, scratch, args)
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


def measure_writes(
    spark: Any, admin: Any, parquet: str, scratch: Path, args: argparse.Namespace
) -> dict[str, list]:
    from clients.spark import write_topic

    schema = spark.read.parquet(parquet).select("key", "value").schema

    def fresh_topic(kind: str, run: int) -> str:
        topic = f"topic://bench/spark/{kind}-{run}-{int(time.time())}"
        admin.create_scalable_topic(topic, args.segments)
        admin.wait_until_ready(topic)
        return topic

    def sink(topic: str, run: int) -> None:
        query = (
            spark.readStream.schema(schema).parquet(parquet)
            .writeStream.format("raytopics").option("topic", topic)
            .option("checkpointLocation", str(scratch / f"sink-checkpoint-{run}"))
            .trigger(availableNow=True)
            .start()
        )  # fmt: skip
        query.awaitTermination()
        assert query.exception() is None, query.exception()

    def batch(topic: str, run: int) -> None:
        write_topic(spark.read.parquet(parquet).select("key", "value"), topic)

    def files(_topic: None, run: int) -> None:
        out = str(scratch / f"parquet-out-{run}")
        spark.read.parquet(parquet).select("key", "value").write.parquet(out)
        shutil.rmtree(out, ignore_errors=True)

    writes = {"stream_sink": sink, "write_topic": batch, "parquet_write": files}
    results: dict[str, list] = {name: [] for name in writes}
    for run in range(args.runs + 1):
        for name, write in writes.items():
            topic = None if name == "parquet_write" else fresh_topic(name.replace("_", "-"), run)
            started = time.perf_counter()
            write(topic, run)
            seconds = time.perf_counter() - started
            if topic is not None:
                stored = admin.get_stats(topic)["records"]
                assert stored == args.records, f"{name} stored {stored} of {args.records} rows"
                admin.delete_scalable_topic(topic)
            label = "warm-up" if run == 0 else f"run {run}"
            rate = args.records / seconds
            print(f"{name} {label}: {rate:,.0f} rows/s ({seconds:.2f}s)", flush=True)
            if run:
                results[name].append({"seconds": round(seconds, 3), "rows_per_s": round(rate)})
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
        **(
            {
                "stream_to_read_topic": round(
                    median["stream_available_now"] / median["read_topic"], 3
                ),
                "stream_to_parquet": round(median["stream_available_now"] / median["parquet"], 3),
            }
            if "read_topic" in median
            else {}
        ),
        "connector_jar": str(args.connector_jar) if args.connector_jar else "this checkout's",
        "sink_to_write_topic": round(median["stream_sink"] / median["write_topic"], 3),
        "sink_to_parquet_write": round(median["stream_sink"] / median["parquet_write"], 3),
        "goal_stream_to_read_topic": 1.0,
    }


if __name__ == "__main__":
    main()
