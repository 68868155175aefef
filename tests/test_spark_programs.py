"""Several Spark programs on one deployment at once (docs/spark.md, "Several Spark
programs"): the test session's Spark runs a streaming query while a second program
reads and writes topics in batches, and a third starts while both run. RayDP names
its masters alike in every session; each program's are in a Ray namespace of its own
(``clients.spark_masters``), so none of them fails at start."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray
from auth_support import client_env
from test_spark_streaming import Batches, Sent, check_key_order, start

from clients import ScalableTopicsAdmin
from clients.spark import read_topic

ROOT = Path(__file__).resolve().parent.parent
TENANT, NAMESPACE = "sparkprograms", "ns"

# A batch program: copies a topic's snapshot to another topic, says how many rows, and
# keeps its Spark running until the file it is given exists.
PROGRAM = """
import sys, time
from pathlib import Path
from clients.spark import read_topic, write_topic
from clients.spark_session import spark_session, stop_spark

source, target, release = sys.argv[1:4]
spark = spark_session("copy", num_executors=1, configs={"spark.ui.enabled": "false"})
frame = read_topic(spark, source)
result = write_topic(frame.select("key", "value"), target)
print("written", result.rows, flush=True)
while not Path(release).exists():
    time.sleep(0.2)
stop_spark()
print("stopped", flush=True)
"""


def test_three_spark_programs_run_at_once_each_reading_and_writing_topics(
    spark, admin: ScalableTopicsAdmin, unique: str, tmp_path: Path
) -> None:
    streamed, copy, copy_of_copy = (
        f"topic://{TENANT}/{NAMESPACE}/{name}-{unique}" for name in ("a", "c", "d")
    )
    admin.create_scalable_topic(streamed, 2)
    admin.create_scalable_topic(copy, 1)
    admin.create_scalable_topic(copy_of_copy, 1)
    sent = Sent(streamed)
    sent.produce(500)
    first = list(sent.values)

    sink = Batches()
    query = start(spark, streamed, sink, tmp_path / "cp", startingOffsets="earliest")
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    second = Program(script, streamed, copy, tmp_path / "release-2")
    third = None
    try:
        assert second.line("written") == "written 500"
        third = Program(script, copy, copy_of_copy, tmp_path / "release-3")
        masters = _app_masters_while(third)
        sent.produce(500)
        assert third.line("written") == "written 500"
        assert len(masters) >= 3, f"RayDP app masters seen at once: {masters}"
        third.stop()
        second.stop()
        sink.wait_for(len(sent.values))
        assert query.exception() is None
    finally:
        query.stop()
        for program in (second, third):
            if program is not None:
                program.kill()

    assert sorted(sink.values()) == sorted(sent.values), "the streaming query lost or repeated"
    check_key_order(sink.rows)
    for topic in (copy, copy_of_copy):
        values = [bytes(r.value).decode() for r in read_topic(spark, topic).collect()]
        assert sorted(values) == sorted(first), topic


class Program:
    """A Spark program in a process of its own: its stdout lines as they come, its
    stderr (Spark's log) in a file."""

    def __init__(self, script: Path, source: str, target: str, release: Path) -> None:
        self.release = release
        self.log = release.with_suffix(".log")
        env = client_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), source, target, str(release)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def line(self, prefix: str, timeout_s: float = 240) -> str:
        """The program's next stdout line starting with ``prefix``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    code = self.process.returncode
                    raise AssertionError(f"exited {code}: {self.tail()}") from None
                continue
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no {prefix!r} line within {timeout_s} s: {self.tail()}")

    def stop(self) -> None:
        """Let it stop its Spark and exit; it must exit 0."""
        self.release.touch()
        assert self.line("stopped") == "stopped"
        assert self.process.wait(60) == 0, self.tail()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def _app_masters_while(program: Program, timeout_s: float = 180) -> set[str]:
    """The namespaces of RayDP's Java app masters once the starting ``program``'s is up
    (or when it exits), all of them alive at the same moment."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline and program.process.poll() is None:
        seen = {
            actor["namespace"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["name"] == "RAY_APP_MASTER"
        }
        if len(seen) >= 3:
            break
        time.sleep(0.5)
    return seen
