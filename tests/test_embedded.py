"""The embedded Ray as programs meet it: real processes on one storage root.

Each program here is a fresh Python process, as a user's would be, so what is
tested is what survives a process: the metadata in the RocksDB GCS under the
storage root, the head shared by programs running at once, the head stopped by
its last user. Every test gets its own storage root and its own Ray temp dir
(``RAY_TMPDIR``), so a `ray start` cluster elsewhere on the machine is never
seen, and the session's own Ray is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from child_output import last_json  # tests/ is on sys.path under pytest
from ports import free_port, free_port_range
from test_examples import stop_group

from runtime.embedded import METADATA_DIR, STATE_FILE, State
from runtime.processes import stop_processes

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TOPIC = "topic://acme/r/events"
MESSAGES = 1_000


class Place:
    """A storage root and a Ray temp dir of one test, and the environment of its programs."""

    def __init__(self, name: str) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: socket paths
        self.root = self.scratch / name
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYTOPICS_"))}
        self.env = env | {
            "RAYTOPICS_STORAGE_ROOT": str(self.root),
            "RAY_TMPDIR": str(self.scratch),
            "RAY_AUTH_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }

    @property
    def state(self) -> State:
        return State.read(self.root / METADATA_DIR / STATE_FILE)

    def run(self, code: str, *args: str, timeout: float = 240, **env: str) -> Run:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=REPO, env=self.env | env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        return Run(proc.returncode, proc.stdout, proc.stderr)

    def start(self, code: str, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=REPO, env=self.env | env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def ray_processes(self) -> list[psutil.Process]:
        """Every Ray process whose command line names this test's Ray temp dir (the
        test's own programs, ``python -c ...``, are not Ray's)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline[1:2] != ["-c"] and any(str(self.scratch) in p for p in cmdline):
                found.append(proc)
        return found

    def clean_up(self) -> None:
        head = self.state.head
        if head is not None:
            stop_processes(head.processes)
        for proc in self.ray_processes():
            proc.kill()
        shutil.rmtree(self.scratch, ignore_errors=True)


class Run:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    def result(self) -> dict:
        assert self.code == 0, self.stdout[-3000:] + self.stderr[-5000:]
        return last_json(self.stdout)

    def said(self) -> list[str]:
        """What connect() reported: its ``raytopics:`` lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("raytopics: ")]


@pytest.fixture
def place() -> Iterator[Place]:
    made = Place("segments")
    try:
        yield made
    finally:
        made.clean_up()


def blocked_signals(pid: int) -> set[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16
    )
    return {sig for sig in range(1, 65) if mask >> (sig - 1) & 1}


def gone(pids: list) -> bool:
    """Whether none of the recorded processes runs any more (a zombie has exited)."""
    return not any(p.alive() for p in pids)


# --- programs -----------------------------------------------------------------------------

PREAMBLE = """
import json, sys, time
from clients import (Checkpoint, CheckpointConsumer, Producer, ScalableTopicsAdmin,
                     StreamConsumer)
from runtime import connect, disconnect, metadata_durability
TOPIC = "topic://acme/r/events"
"""

FIRST = (
    PREAMBLE
    + """
started = time.monotonic()
connect(log_to_driver=False, include_dashboard=False, num_cpus=2)
connected_s = time.monotonic() - started
admin = ScalableTopicsAdmin()
admin.create_scalable_topic(TOPIC, num_segments=2)
admin.create_subscription(TOPIC, "s")
policy = admin.set_policy(TOPIC, {"retention": {"timeS": 86400}})
limits = admin.set_namespace_limits("acme/r", max_message_bytes=1 << 20)
with Producer(TOPIC) as producer:
    producer.send_batch([f"v{i}".encode() for i in range(1000)],
                        keys=[f"k{i}" for i in range(1000)]).result(timeout=60)

# close() waits this long for what was delivered to be acknowledged; half never is
consumer = StreamConsumer(TOPIC, "s", "c1", release_timeout_s=1.0)
received = []
while len(received) < 600:
    message = consumer.receive(timeout=60)
    assert message is not None, len(received)
    received.append(message)
acked = []
for segment in sorted({m.segment_id for m in received}):
    mine = [m for m in received if m.segment_id == segment]
    upto = mine[len(mine) // 2]  # each segment acknowledged to half of what came from it
    consumer.acknowledge_cumulative(upto)
    acked += [f"{m.key}={m.value.decode()}" for m in mine if m.offset <= upto.offset]
consumer.close()

checkpoints = CheckpointConsumer(TOPIC, "g", "cc1")
before = []
while len(before) < 300:
    message = checkpoints.receive(timeout=60)
    assert message is not None, len(before)
    before.append(f"{message.key}={message.value.decode()}")
checkpoint = checkpoints.checkpoint().to_json()
checkpoints.close()
import asyncio
endpoints = [asyncio.run(admin._op("stream_endpoint", name=TOPIC, segment_id=i)) for i in (0, 1)]
print(json.dumps({"acked": acked, "before": before, "checkpoint": checkpoint,
                  "policy": policy, "limits": limits, "connect_s": connected_s,
                  "endpoints": endpoints}))
"""
)

SECOND = (
    PREAMBLE
    + """
first = json.loads(sys.argv[1])
started = time.monotonic()
connect(log_to_driver=False, include_dashboard=False)
connected_s = time.monotonic() - started
admin = ScalableTopicsAdmin()
found = {
    "topics": admin.list_scalable_topics("acme/r"),
    "subscriptions": admin.list_subscriptions(TOPIC),
    "policy": admin.get_policy(TOPIC),
    "limits": admin.get_namespace_limits("acme/r"),
    "durability": metadata_durability(),
}

def drain(consumer, expected):
    got = []
    while len(got) < expected:
        message = consumer.receive(timeout=60)
        if message is None:
            break
        got.append(f"{message.key}={message.value.decode()}")
    extra = consumer.receive(timeout=3)  # nothing more may come
    if extra is not None:
        got.append(f"{extra.key}={extra.value.decode()}")
    consumer.close()
    return got

stream = StreamConsumer(TOPIC, "s", "c1", release_timeout_s=1.0)
found["stream"] = drain(stream, 1000 - len(first["acked"]))
start = Checkpoint.from_json(first["checkpoint"])
found["after_checkpoint"] = drain(
    CheckpointConsumer(TOPIC, "g", "cc1", start=start), 1000 - len(first["before"]))
found["connect_s"] = connected_s
print(json.dumps(found))
"""
)


@pytest.mark.timeout(600)
def test_metadata_outlives_the_program_that_wrote_it(place: Place) -> None:
    """Program 1 writes and exits (its head stops); program 2, started afterwards on
    the same storage root, finds everything and resumes exactly where 1 left off."""
    stale = place.scratch / "ray" / "ray_current_cluster"  # a `ray start` long gone
    stale.parent.mkdir(parents=True)
    stale.write_text(f"127.0.0.1:{free_port()}")

    # as an operator whose clients reach the node through a NAT: data planes at ports of
    # a range opened for them, clients told the node's name (runtime.listen)
    ports = free_port_range(4)
    first_run = place.run(
        FIRST, RAYTOPICS_DATA_PLANE_PORTS=f"{ports[0]}-{ports[-1]}",
        RAYTOPICS_DATA_PLANE_BIND="127.0.0.1", RAYTOPICS_ADVERTISED_HOST="localhost",
    )  # fmt: skip
    first = first_run.result()
    for endpoint in first["endpoints"]:
        assert endpoint["host"] == "localhost" and endpoint["port"] in ports, first["endpoints"]
    gcs = place.root / METADATA_DIR / "gcs"
    assert first_run.said()[0].startswith("raytopics: started the embedded Ray"), first_run.said()
    assert "Ray's token authentication off (RAY_AUTH_MODE=disabled)" in first_run.said()[0]
    assert str(gcs) in first_run.said()[0]
    assert place.state.head is None and not place.ray_processes()  # its last user stopped it

    second_run = place.run(SECOND, json.dumps(first))
    second = second_run.result()
    assert second_run.said()[0].startswith("raytopics: started the embedded Ray")
    assert second["topics"] == [TOPIC]
    assert "s" in second["subscriptions"]
    assert second["policy"] == first["policy"] and second["policy"]["retention"]["timeS"] == 86400
    assert second["limits"] == first["limits"] and second["limits"]["max_message_bytes"] == 1 << 20
    assert second["durability"] == {"backend": "rocksdb", "durable": True}

    everything = {f"k{i}=v{i}" for i in range(MESSAGES)}
    assert len(set(first["acked"])) == len(first["acked"]) and 0 < len(first["acked"]) < 600
    assert len(second["stream"]) == len(set(second["stream"])), "a message came twice"
    assert set(second["stream"]) == everything - set(first["acked"])
    assert len(second["after_checkpoint"]) == len(set(second["after_checkpoint"]))
    assert set(second["after_checkpoint"]) == everything - set(first["before"])
    assert place.state.head is None and not place.ray_processes()
    print(f"connect: fresh head {first['connect_s']:.2f} s, restored {second['connect_s']:.2f} s")


# --- two programs at once -----------------------------------------------------------------

OWNER = (
    PREAMBLE
    + """
connect(log_to_driver=False, include_dashboard=False)
admin = ScalableTopicsAdmin()
admin.create_scalable_topic(TOPIC, num_segments=2)
admin.create_subscription(TOPIC, "s")
with Producer(TOPIC) as producer:
    producer.send_batch([f"a{i}".encode() for i in range(100)],
                        keys=[f"a{i}" for i in range(100)]).result(timeout=60)
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()  # until the test lets it exit
"""
)

GUEST = (
    PREAMBLE
    + """
started = time.monotonic()
connect(log_to_driver=False, num_cpus=1)  # num_cpus: only for a head started here
joined_s = time.monotonic() - started
admin = ScalableTopicsAdmin()
print(json.dumps({"topics": admin.list_scalable_topics("acme/r"), "join_s": joined_s}),
      flush=True)
sys.stdin.readline()  # until the test has the owner exit
with Producer(TOPIC) as producer:
    producer.send_batch([f"b{i}".encode() for i in range(100)],
                        keys=[f"b{i}" for i in range(100)]).result(timeout=60)
consumer = StreamConsumer(TOPIC, "s", "guest")
got = []
while len(got) < 200:
    message = consumer.receive(timeout=60)
    if message is None:
        break
    got.append(message.value.decode())
    consumer.acknowledge_cumulative(message)
consumer.close()
print(json.dumps({"consumed": got}), flush=True)
"""
)

LOITERER = """
import sys
from runtime import connect
connect(log_to_driver=False)
print("{}", flush=True)
sys.stdin.readline()
"""


def read_json_line(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-5000:] if proc.poll() is not None else "no output"
    return json.loads(line)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    out, err = proc.communicate("\n", timeout=timeout)
    assert proc.returncode == 0, err[-5000:]
    return out, err


@pytest.mark.timeout(600)
def test_programs_at_once_share_one_head_stopped_by_the_last(place: Place) -> None:
    """A starts the head, B joins it and keeps working after A exits, C is killed
    (-9) without leaving; when B exits no process of that head is left."""
    owner = place.start(OWNER)
    guest = loiterer = None
    try:
        assert read_json_line(owner) == {"ready": True}
        head = place.state.head
        assert head is not None and head.started_by.pid == owner.pid
        leaked = {k for p in head.processes for k in p.process().environ() if "RAYTOPICS_" in k}
        assert not leaked, f"the owner's settings became the head's: {leaked}"
        for process in head.processes:  # the owner's terminal cannot hang up or stop it
            assert blocked_signals(process.pid) >= {signal.SIGHUP, signal.SIGTSTP}, process

        guest = place.start(GUEST)
        joined = read_json_line(guest)
        assert joined["topics"] == [TOPIC]
        loiterer = place.start(LOITERER)
        read_json_line(loiterer)
        assert {u.pid for u in place.state.users} == {owner.pid, guest.pid, loiterer.pid}
        loiterer.kill()
        loiterer.wait(timeout=30)

        _, owner_err = finish(owner)
        assert place.state.head is not None and place.state.head.head_id == head.head_id
        assert all(p.alive() for p in head.processes), "the head stopped under its guest"

        guest.stdin.write("\n")
        guest.stdin.flush()
        consumed = read_json_line(guest)["consumed"]
        _, guest_err = finish(guest)
    finally:
        for proc in (owner, guest, loiterer):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert sorted(consumed) == sorted([f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)])
    said = [line for line in guest_err.splitlines() if line.startswith("raytopics: ")]
    assert said == [
        f"raytopics: joined the embedded Ray of {place.root} (GCS {head.gcs_address}) "
        f"started by pid {owner.pid}",
        "raytopics: ignored num_cpus: they configure a Ray head, and this Ray was already running",
    ], guest_err
    assert f"started the embedded Ray (GCS {head.gcs_address})" in owner_err
    assert place.state.head is None and place.state.users == []  # C pruned, B stopped it
    assert gone(head.processes)
    assert not place.ray_processes()
    print(f"join: {joined['join_s']:.2f} s")


SAY_WHERE = """
import json
from runtime import connect, metadata_durability
connect(log_to_driver=False)
print(json.dumps(metadata_durability()))
"""


@pytest.mark.timeout(600)
def test_a_head_its_programs_left_behind_is_taken_over(place: Place) -> None:
    """Killed (-9) before it could leave, a program leaves its head running: the next
    program joins it and, as its last user, stops it. A head that lost its GCS is
    not joined: the next program stops what is left of it and starts a new one."""
    killed = place.start(LOITERER)
    read_json_line(killed)
    killed.kill()
    killed.wait(timeout=30)
    orphan = place.state.head
    assert orphan is not None and all(p.alive() for p in orphan.processes)

    heir = place.run(SAY_WHERE)
    assert heir.result() == {"backend": "rocksdb", "durable": True}
    assert heir.said() == [
        f"raytopics: joined the embedded Ray of {place.root} (GCS {orphan.gcs_address}) "
        f"started by pid {killed.pid}"
    ]
    assert place.state.head is None and gone(orphan.processes)

    killed = place.start(LOITERER)
    read_json_line(killed)
    killed.kill()
    killed.wait(timeout=30)
    broken = place.state.head
    assert broken is not None
    gcs = next(p for p in broken.processes if p.kind == "gcs_server")
    gcs.process().kill()

    successor = place.run(SAY_WHERE)
    assert successor.result() == {"backend": "rocksdb", "durable": True}
    said = successor.said()
    assert said[0] == (
        f"raytopics: the embedded Ray of {place.root} cannot serve (its gcs_server "
        f"(pid {gcs.pid}) exited); stopping what is left of it and starting another"
    ), said
    assert said[1].startswith("raytopics: started the embedded Ray"), said
    assert gone(broken.processes)
    assert place.state.head is None and not place.ray_processes()


# --- durability warnings ------------------------------------------------------------------

CHECK_WARNINGS = """
import json, socket, threading, time, urllib.request, warnings
from runtime import MetadataNotDurableWarning, connect, disconnect, metadata_durability
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    connect(log_to_driver=False)
    durability = metadata_durability()
    from actors.gateway.server import start_gateway, stop_gateway
    from clients import Producer, ScalableTopicsAdmin, StreamConsumer
    admin = ScalableTopicsAdmin()
    admin.create_scalable_topic("topic://acme/r/durability", 1)
    stats = admin.get_stats("topic://acme/r/durability")["metadata"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = start_gateway(port)
    with urllib.request.urlopen(url + "/healthz", timeout=30) as reply:
        health = json.loads(reply.read())["metadata"]
    stop_gateway(port)
    # a consumer left waiting on Ray as the program leaves it: told so, the process lives on
    admin.create_subscription("topic://acme/r/durability", "s")
    consumer = StreamConsumer("topic://acme/r/durability", "s", "c", poll_timeout_s=1.0)
    left = []
    def receive():
        try:
            left.append(repr(consumer.receive(timeout=120)))
        except Exception as err:
            left.append(type(err).__name__)
    waiting = threading.Thread(target=receive)
    waiting.start()
    admin.create_scalable_topic("topic://acme/r/unflushed", 1)
    unflushed = Producer("topic://acme/r/unflushed")
    unflushed.send(b"sent, never flushed")
    time.sleep(1)
    disconnect()  # the producer is flushed and closed first
    waiting.join(60)
    connect(log_to_driver=False)  # a second connect in the process: no second warning
    admin = ScalableTopicsAdmin()  # a fresh client
    stored = admin.get_stats("topic://acme/r/unflushed")["records"]
    admin.delete_scalable_topic("topic://acme/r/unflushed")
    admin.delete_scalable_topic("topic://acme/r/durability")
    disconnect()
print(json.dumps({
    "durability": durability,
    "stats": stats,
    "health": health,
    "left_waiting": left,
    "stored_before_disconnect": stored,
    "warnings": [str(w.message) for w in caught
                 if issubclass(w.category, MetadataNotDurableWarning)],
}))
"""


@pytest.mark.timeout(600)
def test_joining_an_in_memory_cluster_warns_once(place: Place) -> None:
    """A `ray start` cluster (found through Ray's ray_current_cluster file) keeps its
    metadata in memory: exactly one MetadataNotDurableWarning. The embedded Ray: none.
    On both, a program that disconnects while a consumer waits on Ray goes on: an open
    producer's sends are flushed first, the consumer's receive raises
    ``ClientClosedError``, and clients made after the next ``connect`` work."""
    port = free_port()
    starter = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=1",
         f"--temp-dir={place.scratch / 'ray'}", "--include-dashboard=false",
         "--disable-usage-stats"],
        env=place.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its processes share this group; stopped by it alone
    )  # fmt: skip
    try:
        output, _ = starter.communicate(timeout=180)
        assert starter.returncode == 0, output
        on_cluster = place.run(CHECK_WARNINGS)
        found = on_cluster.result()
    finally:
        stop_group(starter.pid)
    memory = {"backend": "memory", "durable": False}
    assert found["durability"] == found["stats"] == found["health"] == memory
    assert len(found["warnings"]) == 1, found["warnings"]
    # a receive waiting as the program disconnected: an error, not an exit with 1
    assert found["left_waiting"] == ["ClientClosedError"], found["left_waiting"]
    assert found["stored_before_disconnect"] == 1  # an open producer's send was flushed
    assert "only in memory" in found["warnings"][0]
    assert "Durability of metadata" in found["warnings"][0]
    said = on_cluster.said()
    assert len(said) == 2 and all(f":{port}, started on this machine" in s for s in said), said
    assert not (place.root / METADATA_DIR / STATE_FILE).exists()  # no embedded head

    embedded = Place("segments")
    try:
        on_embedded = embedded.run(CHECK_WARNINGS)
        quiet = on_embedded.result()
        durable = {"backend": "rocksdb", "durable": True}
        assert quiet["durability"] == quiet["stats"] == quiet["health"] == durable
        assert quiet["warnings"] == []
        assert quiet["left_waiting"] == ["ClientClosedError"]
        assert quiet["stored_before_disconnect"] == 1
        assert not embedded.ray_processes()
    finally:
        embedded.clean_up()


@pytest.mark.timeout(300)
def test_embedded_ray_on_redis_keeps_metadata_there(place: Place) -> None:
    """With RAY_REDIS_ADDRESS the embedded head keeps its GCS tables in that Redis
    (Ray's GCS fault tolerance) and says so; it is durable, so nothing warns."""
    redis_bin = shutil.which("redis-server")
    assert redis_bin, "redis-server is missing: ./dev.sh test installs it"
    port = free_port()
    redis = subprocess.Popen(
        [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(place.scratch)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not _answers(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        run = place.run(CHECK_WARNINGS, RAY_REDIS_ADDRESS=f"127.0.0.1:{port}")
        found = run.result()
    finally:
        redis.kill()
        redis.wait(timeout=30)
    durable = {"backend": "redis", "durable": True}
    assert found["durability"] == found["stats"] == found["health"] == durable
    assert found["warnings"] == []
    assert f"with metadata kept in redis://127.0.0.1:{port}" in run.said()[0], run.said()
    assert place.state.head is None and not place.ray_processes()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# --- refused at the start ------------------------------------------------------------------

CONNECT = "from runtime import connect; connect(log_to_driver=False); print('connected')"

HOLD_LOCK = """
import fcntl, sys, time
from pathlib import Path
lock = Path(sys.argv[1])
lock.parent.mkdir(parents=True, exist_ok=True)
handle = open(lock, "a+")
fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what RocksDB does to its LOCK
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(300)
def test_bad_starts_fail_fast_naming_the_cause(place: Place) -> None:
    """An unwritable storage root, an unreachable Redis, a RocksDB LOCK held by a
    stranger: a typed error naming the path or address, within seconds, and no Ray."""
    a_file = place.scratch / "a-file"
    a_file.write_text("not a directory")
    closed = f"127.0.0.1:{free_port()}"
    lock = place.root / METADATA_DIR / "gcs" / "tables" / "LOCK"
    cases = [
        ({"RAYTOPICS_STORAGE_ROOT": str(a_file / "root")}, "InvalidArgumentError",
         f"the storage root {a_file / 'root'} is not writable"),
        ({"RAYTOPICS_STORAGE_ROOT": "/proc/raytopics/root"}, "InvalidArgumentError",
         "the storage root /proc/raytopics/root is not writable"),
        ({"RAY_REDIS_ADDRESS": closed}, "UnavailableError",
         f"RAY_REDIS_ADDRESS={closed}: cannot reach Redis at {closed}"),
        ({}, "ConflictError", f"{lock} is locked by pid"),
    ]  # fmt: skip
    holder = place.start(HOLD_LOCK, str(lock))
    try:
        assert holder.stdout.readline().strip() == "locked"
        for env, error, message in cases:
            started = time.monotonic()
            run = place.run(CONNECT, timeout=60, **env)
            took = time.monotonic() - started
            assert run.code != 0 and "connected" not in run.stdout, (env, run.stderr[-3000:])
            assert error in run.stderr and message in run.stderr, (env, run.stderr[-3000:])
            assert took < 30, (env, took)
            assert not place.ray_processes(), env
        assert f"pid {holder.pid}" in run.stderr  # the stranger is named
    finally:
        holder.kill()
        holder.wait(timeout=30)

    cli = subprocess.run(
        [str(VENV_BIN / "raytopics"), "list", "acme/r"],
        env=place.env | {"RAYTOPICS_STORAGE_ROOT": str(a_file / "root")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 1, cli.stderr
    assert cli.stderr.strip().splitlines() == [
        f"error: the storage root {a_file / 'root'} is not writable (Not a directory at "
        f"{a_file / 'root' / METADATA_DIR}); set RAYTOPICS_STORAGE_ROOT to a directory this "
        "user can write"
    ]
