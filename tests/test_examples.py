"""The examples run as Ray jobs against a real head node, exactly as the README says; and
programs of two lines join it through ``RAY_ADDRESS`` by themselves (``two_lines.py``).

A separate `ray start --head` (its own ports, temp dir and storage root) serves
the jobs, so this module never touches the session's embedded Ray. It is torn
down by signalling its own process group: `ray stop` would stop every Ray on
the machine, including other people's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_ports  # tests/ is on sys.path under pytest
from two_lines import MAKE_TOPIC, TOPIC, run, two_line_programs_work

from runtime.connect import local_system_config

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PORT_OPTIONS = (
    "--port",
    "--dashboard-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
    "--ray-client-server-port",
    "--node-manager-port",
    "--object-manager-port",
)


def cluster_env(storage: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env.update(
        RAY_AUTH_MODE="disabled",
        RAYTOPICS_STORAGE_ROOT=str(storage),
        PYSPARK_PYTHON=sys.executable,
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # `python` in a job is the venv's
    )
    return env


@pytest.fixture(scope="module")
def head() -> Iterator[dict]:
    """A local head node with 2 CPUs; yields the dashboard URL jobs are submitted to."""
    scratch = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: socket paths
    env = cluster_env(scratch / "segments")
    ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
    command = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--num-cpus=2",
        f"--temp-dir={scratch / 'ray'}",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        f"--system-config={json.dumps(local_system_config())}",
        *(f"{option}={port}" for option, port in ports.items()),
    ]
    starter = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # every Ray process of this head shares its process group
    )  # fmt: skip
    try:
        output, _ = starter.communicate(timeout=180)
        assert starter.returncode == 0, output
        yield {
            "url": f"http://127.0.0.1:{ports['--dashboard-port']}",
            "gcs": f"127.0.0.1:{ports['--port']}",
            "env": env,
        }
    finally:
        stop_group(starter.pid)
        shutil.rmtree(scratch, ignore_errors=True)


def stop_group(group: int) -> None:
    """SIGTERM the head's process group, then SIGKILL whatever is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def submit(head: dict, *args: str, timeout: float) -> str:
    """`ray job submit` from the repository root; returns its output, asserting success."""
    command = [
        str(VENV_BIN / "ray"),
        "job",
        "submit",
        "--address",
        head["url"],
        "--working-dir",
        ".",
        "--",
        "python",
        *args,
    ]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=head["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "succeeded" in output, output[-5000:]
    return output


def test_quickstart_as_a_ray_job(head: dict) -> None:
    output = submit(head, "examples/quickstart.py", timeout=300)
    assert "split segment 0 into (2, 3) while producing" in output
    assert "split segment 1 into (4, 5) while producing" in output
    assert "consumed 20000 messages" in output
    assert "quickstart OK: 20000 messages, 100 keys, per-key order kept" in output
    assert "deleted topic://quickstart/demo/" in output


def test_spark_pipeline_as_a_ray_job(head: dict) -> None:
    events = 200_000  # the example's default is 1,000,000; this keeps the suite quick
    output = submit(head, "examples/spark_pipeline.py", "--events", str(events), timeout=600)
    assert "split segment 0 into (2, 3) during ingestion" in output
    assert "split segment 1 into (4, 5) during ingestion" in output
    # The plan lists the segments holding data (a parent split before any event reached
    # it holds none); that every event was read is proven by the counts and sums below.
    listed = next(line for line in output.splitlines() if line.startswith("reading segments ["))
    read = {int(x) for x in listed.split("[", 1)[1].split("]", 1)[0].split(",")}
    assert read and read <= set(range(6)) and {2, 3, 4, 5} & read
    assert "MISMATCH" not in output
    all_row = next(line.split() for line in output.splitlines() if line.startswith("ALL "))
    assert int(all_row[1]) == int(all_row[2]) == events
    assert f"spark_pipeline OK: {events} events, 1000 users, counts and sums match" in output
    assert "deleted topic://pipeline/demo/" in output


def test_spark_streaming_pipeline_as_a_ray_job(head: dict) -> None:
    output = submit(head, "examples/spark_streaming.py", "--demo", timeout=900)
    assert "query stopped; producing more while it is down" in output
    assert "sent 5000, written 5000, missing 0, duplicated 0" in output
    assert "spark_streaming OK: 5000 events, each written once" in output


def test_two_lines_on_the_cluster_at_ray_address(head: dict) -> None:
    two_line_programs_work(head["env"] | {"RAY_ADDRESS": head["gcs"]})


def test_a_program_that_calls_ray_init_first_sees_the_topics(head: dict) -> None:
    """Ray users call ``ray.init()`` before using a library: the job's namespace is then
    an anonymous one of its own, and the topics another program made must still be
    there. A job that names its namespace is told that it works in it."""
    env = head["env"] | {"RAY_ADDRESS": head["gcs"]}
    topic = "topic://acme/init-first/events"
    made = run(MAKE_TOPIC.replace(TOPIC, topic), env)
    assert made.returncode == 0, made.stderr[-3000:]
    listing = "import ray\n{init}\nfrom clients import ScalableTopicsAdmin\n" + (
        "print(ScalableTopicsAdmin().list_scalable_topics('acme/init-first'))"
    )
    seen = run(listing.format(init="ray.init()"), env)
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert topic in seen.stdout.strip().splitlines()[-1], seen.stdout
    own = run(listing.format(init="ray.init(namespace='mine')"), env)
    assert own.returncode == 0, own.stderr[-3000:]
    assert own.stdout.strip().splitlines()[-1] == "[]", own.stdout  # its own namespace...
    assert "using this program's Ray namespace 'mine'" in own.stderr, own.stderr[-3000:]
