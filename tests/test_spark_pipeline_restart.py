"""A read → transform → write streaming pipeline (``examples/spark_streaming.py``) whose
Spark driver is killed (SIGKILL) mid-stream, and then all of Ray with it, is started
again from its checkpoint: the output topic holds each input's result exactly once,
through a split of the input.

The head is a private ``ray start --head`` whose GCS lives in Redis
(``tests/ray_head.py``): the topics, their layouts and the sink's record of each
write must come back from it, since the replayed batch is only stored once if the
sink still knows what the killed driver stored. Every program here (the pipeline,
as ``ray job submit`` would run it, and the small steps that produce and count)
joins that head as its own process: a driver joins one Ray for life, and this
session's tests share another.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ray_head import head_on_redis  # noqa: E402

EXAMPLE = ROOT / "examples" / "spark_streaming.py"
SENT = [f"event-{i}" for i in range(4000)]
FIRST = 3000  # produced before the pipeline starts; the rest after the split
PER_BATCH = 250


@pytest.mark.timeout(900)
def test_a_pipeline_killed_with_all_of_ray_resumes_from_its_checkpoint_writing_each_once(
    tmp_path: Path,
) -> None:
    run = uuid.uuid4().hex[:8]
    source, sink = f"topic://pipe/ns/in-{run}", f"topic://pipe/ns/out-{run}"
    checkpoint = tmp_path / "cp"
    with head_on_redis(tmp_path, num_cpus=4) as head:
        env = head.env(f"pipe-{run}") | {"PYSPARK_PYTHON": sys.executable}

        def step(phase: str) -> list[str]:
            out = tmp_path / f"{phase}.json"
            done = subprocess.run(
                [sys.executable, __file__, phase, str(out), source, sink],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            assert done.returncode == 0, f"{phase}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
            return json.loads(out.read_text())

        command = [
            sys.executable, str(EXAMPLE), "--input", source, "--output", sink,
            "--checkpoint", str(checkpoint), "--max-per-batch", str(PER_BATCH),
        ]  # fmt: skip
        step("produce_first")
        log = tmp_path / "first.log"
        first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=-2)
        try:
            deadline = time.monotonic() + 300
            while _committed(checkpoint) < 4 and time.monotonic() < deadline:  # ≥ 1,000 rows
                assert first.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
            step("split_and_produce_rest")
            time.sleep(1)
        finally:
            first.send_signal(signal.SIGKILL)  # the driver dies mid-stream, its executors with it
            first.wait(60)
        written_before = len(step("stored"))
        assert 1000 <= written_before < len(SENT), written_before

        assert head.kill() > 0  # all of Ray, as `ray stop --force` would
        head.start()
        second = subprocess.run(
            [*command, "--available-now"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        got = Counter(step("stored"))
    expected = Counter(v.upper() for v in SENT)
    assert got == expected, (
        f"missing {sum((expected - got).values())}, "
        f"duplicated {sum(n - 1 for n in got.values() if n > 1)}"
    )


def _committed(checkpoint: Path) -> int:
    """Micro-batches the query committed: Spark writes ``commits/N`` after batch N."""
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


# --- the steps (run as subprocesses, joined to the head by RAY_ADDRESS) --------------


def _send(source: str, values: list[str]) -> None:
    from clients import Producer

    with Producer(source) as producer:
        for i, value in enumerate(values):
            producer.send(value.encode(), key=f"user-{i % 40}")


def produce_first(source: str, sink: str) -> list[str]:
    from clients import ScalableTopicsAdmin

    admin = ScalableTopicsAdmin()
    admin.create_scalable_topic(source, 2)
    admin.create_scalable_topic(sink, 2)
    _send(source, SENT[:FIRST])
    return SENT[:FIRST]


def split_and_produce_rest(source: str, sink: str) -> list[str]:
    from clients import ScalableTopicsAdmin

    ScalableTopicsAdmin().split_segment(source, 0)
    _send(source, SENT[FIRST:])
    return SENT[FIRST:]


def stored(source: str, sink: str) -> list[str]:
    """Every value the sink topic holds, from each of its segments."""
    import ray

    from clients import ScalableTopicsAdmin
    from runtime.names import TopicName
    from tests.segments import segment_actor

    values = []
    for info in ScalableTopicsAdmin().get_layout(sink).all_segments.values():
        handle = segment_actor(info.name(TopicName.parse(sink)))
        batch = ray.get(handle.read.remote(0, 1_000_000))
        values += [v.decode() for v in batch.column("value").to_pylist()]
    return values


if __name__ == "__main__":
    phase, out, source, sink = sys.argv[1:5]
    steps = {"produce_first": produce_first, "stored": stored}
    steps["split_and_produce_rest"] = split_and_produce_rest
    Path(out).write_text(json.dumps(steps[phase](source, sink)))
