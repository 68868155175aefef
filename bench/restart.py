"""Restart latency: how long after all of Ray went down a topic takes writes and delivers again.

State that outlives Ray is only worth as much as the wait to get it back. Two cases:

* **cluster** (Ray's GCS fault tolerance on a private redis-server with an
  append-only file): a topic of ``--segments`` (8) segments and ``--subscriptions``
  (3) subscriptions with a backlog. Each round SIGKILLs every process of the head
  (what ``ray stop --force`` does, but only to this head: see tests/ray_head.py),
  then runs ``ray start --head`` on the same Redis and port and, once it returns,
  launches a client program (a ``Producer`` and a ``StreamConsumer`` on the first
  subscription, in two threads). Measured from the moment ``ray start`` is
  launched: the first send stored by its segment, and the first message received.
  The peer, in the same rounds: the same head on its own Redis with no project
  state at all, to a bare ``ray.init`` in a fresh program: the floor any Ray
  application pays.
* **embedded** (``connect()`` with no cluster): a first program stores the topic;
  then each round launches a second program like it, and measures from its
  process launch to its first stored send. Whatever ``connect()`` keeps between
  programs decides whether that program finds its topic (``topic_found`` in the
  results). The peer: a program doing only a bare embedded ``ray.init``.

Where the time goes (cluster rounds): the head's processes and their start times,
every project actor's process launch and the moment Ray marked it ALIVE (from
GCS's actor table after the round: no polling to disturb the round), the client
program's own steps, and the CPU seconds each part burnt before the round ended.

    .venv/bin/python bench/restart.py                  # both cases, 5 rounds each, ~7 min
    .venv/bin/python bench/restart.py --rounds 3 --skip-embedded

Needs Debian's redis-server (apt-get install -y redis-server). Prints a summary
and writes bench/results/restart.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _common import machine_info, report, write_report  # noqa: E402

DEFAULT_RESULTS = REPO / "bench" / "results" / "restart.json"
TOPIC = "topic://bench/restart/events"
NAMESPACE = "bench/restart"
CONSUMER = "bench"
FIRST_KEY = "key-0"  # the key of the client's first send
BACKLOG = 10_000  # messages stored before the first round, never acknowledged
RESULT = "RESULT "  # prefix of a program's one line of results among Ray's log lines
GOALS_S = {"cluster_first_stored": 10.0, "embedded_first_stored": 5.0}


# --- the programs (each run as `python bench/restart.py <program> ...`) ---------------


def program_setup(segments: int, subscriptions: int) -> dict[str, Any]:
    """Create the cluster case's topic with its subscriptions and a backlog."""
    from clients import Producer, ScalableTopicsAdmin

    admin = ScalableTopicsAdmin()
    admin.create_scalable_topic(TOPIC, segments)
    for i in range(subscriptions):
        admin.create_subscription(TOPIC, f"s{i}")
    keys = [f"key-{i % 1000}" for i in range(BACKLOG)]
    with Producer(TOPIC) as producer:
        producer.send_batch([b"x" * 100] * BACKLOG, keys=keys).result()
    return {"records": admin.get_stats(TOPIC)["records"]}


def program_client(launched: float) -> dict[str, Any]:
    """After a restart: produce one message and receive one, each in its own thread,
    as a producing service and a consuming one would, timestamping every step."""
    marks: dict[str, float] = {"launched": launched, "started": time.time()}
    from clients import Producer, StreamConsumer
    from runtime import connect

    marks["imported"] = time.time()
    connect(log_to_driver=False)
    marks["connected"] = time.time()

    def consume() -> None:
        consumer = StreamConsumer(TOPIC, "s0", CONSUMER)
        marks["consumer_ready"] = time.time()
        if consumer.receive(timeout=120) is not None:  # the backlog, never acknowledged
            marks["first_received"] = time.time()
        consumer.close()

    reader = threading.Thread(target=consume)
    reader.start()
    producer = Producer(TOPIC)
    marks["producer_ready"] = time.time()
    producer.send(b"after the restart", key=FIRST_KEY).result(timeout=120)
    marks["first_stored"] = time.time()
    reader.join()
    cpu = os.times()
    producer.close()
    return {"marks": marks, "cpu_s": round(cpu.user + cpu.system, 2)}


def program_floor(launched: float) -> dict[str, Any]:
    """Only ``ray.init`` (joining RAY_ADDRESS, or an embedded Ray without it)."""
    marks = {"launched": launched, "started": time.time()}
    import ray

    from runtime.connect import LOCAL_SYSTEM_CONFIG

    marks["imported"] = time.time()
    if "RAY_ADDRESS" in os.environ:
        ray.init(log_to_driver=False)
    else:
        ray.init(address="local", log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    marks["connected"] = time.time()
    return {"marks": marks}


def program_embedded(launched: float, segments: int) -> dict[str, Any]:
    """The embedded case's program: find the topic (or create it), then send one message."""
    marks = {"launched": launched, "started": time.time()}
    from clients import Producer, ScalableTopicsAdmin
    from runtime import connect

    marks["imported"] = time.time()
    connect(log_to_driver=False)
    marks["connected"] = time.time()
    admin = ScalableTopicsAdmin()
    found = TOPIC in admin.list_scalable_topics(NAMESPACE)
    if not found:
        admin.create_scalable_topic(TOPIC, segments)
    marks["topic_ready"] = time.time()
    producer = Producer(TOPIC)
    marks["producer_ready"] = time.time()
    producer.send(b"after the restart", key=FIRST_KEY).result(timeout=120)
    marks["first_stored"] = time.time()
    producer.close()
    return {"marks": marks, "topic_found": found}


PROGRAMS = {
    "setup": lambda args: program_setup(int(args[0]), int(args[1])),
    "client": lambda args: program_client(float(args[0])),
    "floor": lambda args: program_floor(float(args[0])),
    "embedded": lambda args: program_embedded(float(args[0]), int(args[1])),
}


def run_program(name: str, env: dict[str, str], *args: Any, timeout_s: float = 300) -> dict:
    """Launch a program; its results, with the launch time it was given."""
    launched = time.time()
    command = [sys.executable, __file__, name, *map(str, args)]
    if name != "setup":
        command.insert(3, repr(launched))
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


# --- the cluster case -------------------------------------------------------------------


def cluster_rounds(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from tests.ray_head import head_on_redis

    namespace = f"bench-restart-{uuid.uuid4().hex[:8]}"
    rounds, floors = [], []
    with (
        head_on_redis(root / "project") as head,
        head_on_redis(root / "floor") as bare,
    ):
        setup = run_program("setup", head.env(namespace), args.segments, args.subscriptions)
        print(f"cluster: topic of {args.segments} segments, {setup['records']} records stored")
        wait_alive(head, namespace, deadline_s=120)
        # Each head is down while the other one's round runs: no idle Ray beside it.
        head.kill()
        bare.kill()
        for i in range(args.rounds):
            rounds.append(cluster_round(head, namespace))
            print(f"cluster round {i}: {describe(rounds[-1]['since_ray_start_s'])}", flush=True)
            floors.append(floor_round(bare))
            print(f"  floor round {i}: {describe(floors[-1]['since_ray_start_s'])}", flush=True)
    return {
        "settings": {
            "segments": args.segments,
            "subscriptions": args.subscriptions,
            "backlog_messages": BACKLOG,
            "redis": "redis-server, appendonly yes, appendfsync everysec, on loopback",
            "head": "ray start --head --num-cpus=2 --include-dashboard=false, "
            "--system-config=LOCAL_SYSTEM_CONFIG; stopped by SIGKILL of all its processes",
            "client": "one program: Producer + StreamConsumer (subscription s0), two threads, "
            "launched when ray start returns",
            "floor": "the same head on its own empty Redis, then a program doing only ray.init",
        },
        "summary_s": summarize([r["since_ray_start_s"] for r in rounds]),
        "floor_summary_s": summarize([r["since_ray_start_s"] for r in floors]),
        "actors_summary_s": summarize([r["actors_s"] for r in rounds]),
        "cpu_summary_s": summarize([r["cpu_s"] for r in rounds]),
        "rounds": rounds,
        "floor_rounds": floors,
    }


def cluster_round(head: Any, namespace: str) -> dict[str, Any]:
    """Start the (killed) head again, run the client; the timeline from ``ray start``.
    Ends by killing the head, as ``ray stop --force`` would, with every actor ALIVE."""
    time.sleep(1)  # the kernel reaps the killed processes and frees their ports
    load = round(os.getloadavg()[0], 2)
    t0 = time.time()
    gcs = GcsWatch(head.port, t0)
    head.start()
    head_up = time.time()
    gcs.stop()
    client = run_program("client", head.env(namespace))
    cpu = cpu_by_part(head) | {"client_program": client["cpu_s"]}
    actors = actor_timeline(wait_alive(head, namespace, deadline_s=120), t0)  # pids: live
    started = head_timeline(head, t0)
    head.kill()
    since = {
        "gcs_accepting": gcs.seen,
        "ray_start_returned": head_up - t0,
        **{name: at - t0 for name, at in client["marks"].items()},
    }
    return {
        "load_average_1min": load,
        "since_ray_start_s": {k: round(v, 2) for k, v in since.items() if v is not None},
        "actors_s": actors,
        "head_processes_started_s": started,
        "cpu_s": cpu,
    }


def floor_round(bare: Any) -> dict[str, Any]:
    """The same for the empty head and a program that only joins it."""
    time.sleep(1)
    t0 = time.time()
    bare.start()
    head_up = time.time()
    floor = run_program("floor", bare.env(f"floor-{uuid.uuid4().hex[:8]}"))
    bare.kill()
    since = {"ray_start_returned": head_up - t0}
    since |= {name: at - t0 for name, at in floor["marks"].items()}
    return {"since_ray_start_s": {k: round(v, 2) for k, v in since.items()}}


class GcsWatch:
    """When the GCS port first accepts a connection: one connect() every 20 ms."""

    def __init__(self, port: int, t0: float) -> None:
        self.seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(port, t0), daemon=True)
        self._thread.start()

    def _run(self, port: int, t0: float) -> None:
        while not self._stop.is_set() and self.seen is None:
            with socket.socket() as sock:
                sock.settimeout(0.1)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    self.seen = time.time() - t0
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_alive(head: Any, namespace: str, deadline_s: float) -> list[dict[str, Any]]:
    """The project's actors from GCS's actor table, once all of them are ALIVE."""
    code = (
        "import json, ray, ray._private.state as s; ray.init(log_to_driver=False); "
        f"print({RESULT!r} + json.dumps(list(s.actors().values()), default=str))"
    )
    deadline = time.monotonic() + deadline_s
    while True:
        done = subprocess.run(
            [sys.executable, "-c", code], env=head.env(namespace), capture_output=True, text=True
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        actors = [a for a in json.loads(lines[-1][len(RESULT) :]) if a["Name"]] if lines else []
        if actors and all(a["State"] == "ALIVE" for a in actors):
            return actors
        if time.monotonic() > deadline:
            raise RuntimeError(f"actors not all alive: {[(a['Name'], a['State']) for a in actors]}")
        time.sleep(0.5)


def actor_timeline(actors: list[dict[str, Any]], t0: float) -> dict[str, float]:
    """Per kind of actor: first process launch, last ALIVE, and the slowest boot
    (launch to ALIVE: interpreter, Ray's worker, our imports, ``__init__``) in this
    round; the median boot; and when the segment the client's first send goes to
    was ALIVE."""
    import psutil

    from runtime.hashing import key_hash

    target = key_hash(FIRST_KEY)
    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    timeline: dict[str, float] = {}
    for actor in actors:
        kind = actor["Name"].split(":")[0]
        alive = float(actor["Timestamp"]) / 1000
        with contextlib.suppress(psutil.Error):
            launched = psutil.Process(int(actor["Pid"])).create_time()
            by_kind[kind].append((launched, alive))
        if kind == "segment":
            start, end, _ = actor["Name"].rsplit("/", 1)[1].split("-")
            if int(start, 16) <= target <= int(end, 16):
                timeline["first_send_segment_alive"] = round(alive - t0, 2)
    everything = [pair for pairs in by_kind.values() for pair in pairs]
    for kind, pairs in [*by_kind.items(), ("all", everything)]:
        timeline[f"{kind}_first_launched"] = round(min(p[0] for p in pairs) - t0, 2)
        timeline[f"{kind}_last_alive"] = round(max(p[1] for p in pairs) - t0, 2)
        timeline[f"{kind}_max_boot"] = round(max(p[1] - p[0] for p in pairs), 2)
    timeline["all_median_boot"] = round(statistics.median(p[1] - p[0] for p in everything), 2)
    timeline["actors"] = len(everything)
    return timeline


def head_timeline(head: Any, t0: float) -> dict[str, float]:
    """When each of the head's own processes started (workers left out)."""
    started: dict[str, float] = {}
    for proc in head.processes():
        name = _part(proc)
        if name.startswith("head:"):
            with contextlib.suppress(Exception):
                started[name[5:]] = round(proc.create_time() - t0, 2)
    return dict(sorted(started.items(), key=lambda item: item[1]))


def cpu_by_part(head: Any) -> dict[str, float]:
    """CPU seconds (user + system) burnt so far by the head's processes, grouped."""
    cpu: dict[str, float] = defaultdict(float)
    for proc in head.processes():
        with contextlib.suppress(Exception):
            times = proc.cpu_times()
            cpu[_part(proc)] += times.user + times.system
    return {part: round(seconds, 2) for part, seconds in sorted(cpu.items())}


def _part(proc: Any) -> str:
    """``head:<component>`` for Ray's own processes, the actor class for actors."""
    name, cmdline = proc.name(), " ".join(proc.cmdline())
    if name.startswith("ray::"):
        if name in ("ray::DashboardAgent", "ray::RuntimeEnvAgent"):
            return f"head:{name[5:]}"
        return "idle_workers" if name == "ray::IDLE" else name[5:]
    for marker, part in (
        ("gcs_server", "gcs_server"),
        ("raylet", "raylet"),
        ("dashboard.py", "dashboard"),
        ("log_monitor.py", "log_monitor"),  # before monitor.py, which it contains
        ("monitor.py", "monitor"),
        ("client.server", "client_server"),
    ):
        if marker in cmdline:
            return f"head:{part}"
    return f"head:{name}"


# --- the embedded case ------------------------------------------------------------------


def embedded_rounds(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    # A private RAY_TMPDIR: connect() with no address may join a cluster that `ray start`
    # left on this machine (Ray's ray_current_cluster file under the default temp dir),
    # and any other program's cluster is not the case measured here. Short, for Ray's
    # unix socket paths.
    tmpdir = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    env |= {
        "RAY_TMPDIR": str(tmpdir),
        "RAY_AUTH_MODE": "disabled",
        "RAYTOPICS_STORAGE_ROOT": str(root / "embedded"),
        "RAYTOPICS_NAMESPACE": f"bench-embedded-{uuid.uuid4().hex[:8]}",
        "PYTHONPATH": str(REPO),
    }
    try:
        return _embedded_rounds(args, env)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _embedded_rounds(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    first = run_program("embedded", env, args.segments)
    print(f"embedded: first program {describe(since_launch(first))}", flush=True)
    rounds, floors = [], []
    for i in range(args.rounds):
        load = round(os.getloadavg()[0], 2)
        second = run_program("embedded", env, args.segments)
        rounds.append(
            {
                "load_average_1min": load,
                "since_launch_s": since_launch(second),
                "topic_found": second["topic_found"],
            }
        )
        print(
            f"embedded round {i}: topic_found={second['topic_found']} "
            f"{describe(rounds[-1]['since_launch_s'])}",
            flush=True,
        )
        floors.append({"since_launch_s": since_launch(run_program("floor", env))})
        print(f"  floor round {i}: {describe(floors[-1]['since_launch_s'])}", flush=True)
    return {
        "settings": {
            "segments": args.segments,
            "program": "connect(); find the topic (create it if missing); Producer; one send",
            "floor": "a program doing only ray.init(address='local', LOCAL_SYSTEM_CONFIG)",
        },
        "first_program": {
            "since_launch_s": since_launch(first),
            "topic_found": first["topic_found"],
        },
        "topic_found_in_every_round": all(r["topic_found"] for r in rounds),
        "summary_s": summarize([r["since_launch_s"] for r in rounds]),
        "floor_summary_s": summarize([r["since_launch_s"] for r in floors]),
        "rounds": rounds,
        "floor_rounds": floors,
    }


def since_launch(result: dict[str, Any]) -> dict[str, float]:
    marks = result["marks"]
    return {name: round(at - marks["launched"], 2) for name, at in marks.items()}


# --- reporting --------------------------------------------------------------------------


def summarize(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Median, min and max of each figure over the rounds that have it."""
    values: dict[str, list[float]] = defaultdict(list)
    for figures in rounds:
        for name, value in figures.items():
            values[name].append(value)
    return {
        name: {
            "median": round(statistics.median(v), 2),
            "min": round(min(v), 2),
            "max": round(max(v), 2),
        }
        for name, v in values.items()
    }


def describe(figures: dict[str, float]) -> str:
    keys = ("ray_start_returned", "connected", "first_stored", "first_received")
    return ", ".join(f"{k} {figures[k]:.2f}s" for k in keys if k in figures)


def goals(cluster: dict[str, Any] | None, embedded: dict[str, Any] | None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if cluster:
        median = cluster["summary_s"]["first_stored"]["median"]
        goal = GOALS_S["cluster_first_stored"]
        found["cluster_first_stored"] = {"goal_s": goal, "median_s": median, "met": median <= goal}
    if embedded:
        median = embedded["summary_s"]["first_stored"]["median"]
        goal = GOALS_S["embedded_first_stored"]
        found["embedded_first_stored"] = {
            "goal_s": goal,
            "median_s": median,
            "met": median <= goal and embedded["topic_found_in_every_round"],
            "topic_found_in_every_round": embedded["topic_found_in_every_round"],
        }
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--subscriptions", type=int, default=3)
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    info = machine_info()
    started = time.perf_counter()
    cluster = embedded = None
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        if not args.skip_cluster:
            cluster = cluster_rounds(args, Path(tmp))
        if not args.skip_embedded:
            embedded = embedded_rounds(args, Path(tmp))
    info["load_average_at_end"] = os.getloadavg()
    found = goals(cluster, embedded)
    print()
    for name, part in (("cluster", cluster), ("embedded", embedded)):
        if part:
            for figure, stats in part["summary_s"].items():
                print(f"{name:<9}{figure:<22}{stats}")
            for figure, stats in part["floor_summary_s"].items():
                print(f"{name + ' floor':<15}{figure:<16}{stats}")
    if cluster:
        for part in ("actors_summary_s", "cpu_summary_s"):
            medians = {k: v["median"] for k, v in cluster[part].items()}
            print(f"cluster {part} (medians): {medians}")
    for name, goal in found.items():
        print(f"goal {name}: {'met' if goal['met'] else 'NOT met'} ({goal})")
    results = report("restart", started, info, cluster=cluster, embedded=embedded, goals=found)
    write_report(args.out, results)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in PROGRAMS:
        print(RESULT + json.dumps(PROGRAMS[sys.argv[1]](sys.argv[2:])), flush=True)
    else:
        sys.exit(main())
