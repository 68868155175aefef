"""A read → transform → write streaming pipeline (``examples/spark_streaming.py``) whose
Spark driver is killed (SIGKILL) mid-stream and started again from its checkpoint:
the output topic holds each input's result exactly once, through a split of the input.

The pipeline runs as its own program joined to this session's Ray, as ``ray job
submit`` would run it; this module starts no Spark of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import ray

from actors.segment import segment_actor
from clients import Producer, ScalableTopicsAdmin
from runtime.names import TopicName

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "spark_streaming.py"


def stored(topic: str, admin: ScalableTopicsAdmin) -> list[str]:
    values = []
    for info in admin.get_layout(topic).all_segments.values():
        batch = ray.get(segment_actor(info.name(TopicName.parse(topic))).read.remote(0, 1_000_000))
        values += [v.decode() for v in batch.column("value").to_pylist()]
    return values


def test_a_killed_driver_restarted_from_its_checkpoint_writes_everything_once(
    admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    source, sink = f"topic://pipe/ns/in-{unique}", f"topic://pipe/ns/out-{unique}"
    admin.create_scalable_topic(source, 2)
    admin.create_scalable_topic(sink, 2)
    sent = [f"event-{i}" for i in range(4000)]
    with Producer(source) as producer:
        for i, value in enumerate(sent[:3000]):
            producer.send(value.encode(), key=f"user-{i % 40}")
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "RAYTOPICS_NAMESPACE": ray.get_runtime_context().namespace,
        "PYSPARK_PYTHON": sys.executable,
    }
    command = [
        sys.executable, str(EXAMPLE), "--input", source, "--output", sink,
        "--checkpoint", str(tmp_path / "cp"), "--max-per-batch", "250",
    ]  # fmt: skip
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while len(stored(sink, admin)) < 1000 and time.monotonic() < deadline:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.5)
        admin.split_segment(source, 0)
        with Producer(source) as producer:
            for i, value in enumerate(sent[3000:]):
                producer.send(value.encode(), key=f"user-{i % 40}")
        time.sleep(1)
    finally:
        first.send_signal(signal.SIGKILL)  # the driver dies mid-stream, its executors with it
        first.wait(60)
    written_before = len(stored(sink, admin))
    assert 1000 <= written_before < 4000, written_before

    second = subprocess.run(
        [*command, "--available-now"], env=env, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    got = Counter(stored(sink, admin))
    assert got == Counter(v.upper() for v in sent), (
        f"missing {sum((Counter(v.upper() for v in sent) - got).values())}, "
        f"duplicated {sum(n - 1 for n in got.values() if n > 1)}"
    )
    admin.delete_scalable_topic(source)
    admin.delete_scalable_topic(sink)
