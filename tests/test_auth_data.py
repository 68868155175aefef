"""Authentication where the data lives: segments, their data plane, coordinators, the DAG watch.

The cluster's stored policy decides, never the client: every client path is
tried from processes whose environment names no policy file, with no token, a
wrong one, a revoked one and one for another namespace, and with tokens whose
grants fall short; each is refused with the typed error, and nothing is stored,
acknowledged or registered. Running clients lose access within seconds of a
revocation. The data plane refuses a connection that does not open with a HELLO
carrying an accepted credential, and garbage of every kind leaves a segment
serving a well-behaved producer exactly.

One policy is stored for the whole module (restored to "off" afterwards: the
test session shares one Ray).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from child_output import last_json  # tests/ is on sys.path under pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.control.controller_host import controller_actor
from actors.controller_directory import ControllerDirectory, ControllerHandle
from actors.guard import REFRESH_S, guard
from actors.registry import alive_actor_names
from clients import CheckpointConsumer, Producer, QueueConsumer, ScalableTopicsAdmin, StreamConsumer
from runtime import wire
from runtime.auth import AuthPolicy, client_credential
from runtime.batch import make_batch, serialize_batch
from runtime.errors import (
    InvalidArgumentError,
    InvalidNameError,
    TransactionNotFoundError,
    TransactionNotOpenError,
    UnauthenticatedError,
    UnauthorizedError,
)
from runtime.names import SegmentName, TopicName
from runtime.replica_frames import decode_shipment, encode_fetch
from runtime.replication import Fetch
from storage.catalog import Catalog
from tests.segments import segment_actor

ROOT = Path(__file__).resolve().parents[1]
NS = "authdata/orders"
OTHER_NS = "authdata/elsewhere"
NAMES = ("ops", "app", "other", "revoked", "reader", "writer", "looker", "victim", "demoted")
TOKENS = {name: f"{name}-data-plane-token-0123456789" for name in NAMES}
GRANTS: dict[str, list[tuple[str, list[str]]]] = {
    "ops": [("*", ["admin"])],
    "app": [(NS, ["produce", "consume"])],
    "other": [(OTHER_NS, ["produce", "consume"])],
    "revoked": [(NS, ["produce", "consume"])],
    "reader": [(NS, ["consume"])],
    "writer": [(NS, ["produce"])],
    "looker": [(NS, ["lookup"])],
    "victim": [(NS, ["produce", "consume"])],
    "demoted": [(NS, ["produce", "consume"])],
}
# What each operation of tests/auth_probe.py needs, written out by hand (the
# permissions of docs/security.md).
LOOKUP_OPS = {
    "dagwatch.listen",
    "dagwatch.layout",
    "segment.data_endpoint",
    "controller.wake_segment",  # starts only a hibernating segment of the layout
}
PRODUCE_OPS = {
    "Producer",
    "Producer(transport=ray)",
    "SegmentChannel",
    "raw data plane",
    "segment.append",
    "segment.append(txn)",
}
CONSUME_OPS = {
    "StreamConsumer",
    "QueueConsumer",
    "CheckpointConsumer",
    "read_topic_dataset",
    "ReadChannel",
    "take",
    "settle",
    *(f"segment.{m}" for m in ("read", "ack", "ack_cumulative")),
    "segment.position",
    *(
        f"coordinator.{m}"
        for m in ("register", "poll", "release", "finished", "unregister", "reset")
    ),
    "coordinator.snapshot",
    "coordinator.ensure_group",
}
ADMIN_OPS = {
    *(
        f"segment.{m}"
        for m in ("ready", "stats", "subscriptions", "check_epoch", "retain", "terminate")
    ),
    "segment.create_subscription",
    "segment.delete_subscription",
    "segment.seek",
    "segment.delete",
    "host.open",
    "host.close",
    "host.close_topic",
    "host.call(opening)",
    "coordinators.stop",
    "coordinators.stop_topic",
    "dagwatch.notify",
}
ALLOWED = {
    "reader": LOOKUP_OPS | CONSUME_OPS,
    "writer": LOOKUP_OPS | PRODUCE_OPS,
    "looker": LOOKUP_OPS,
}


def store_policy(grants: dict[str, list[tuple[str, list[str]]]]) -> None:
    doc = {
        "tokens": [
            {
                "principal": name,
                "token": TOKENS[name],
                "grants": [{"namespace": ns, "actions": actions} for ns, actions in given],
            }
            for name, given in grants.items()
        ]
    }
    Catalog().replace_auth(AuthPolicy.from_config(doc))


def without(*names: str, **changed: list[tuple[str, list[str]]]) -> dict[str, Any]:
    grants = {k: v for k, v in GRANTS.items() if k not in names}
    return {**grants, **changed}


@pytest.fixture(scope="module")
def auth(ray_cluster) -> Iterator[None]:
    """The module's policy: every token of ``GRANTS``, then ``revoked`` taken away."""
    store_policy(GRANTS)
    store_policy(without("revoked"))
    time.sleep(1.5 * REFRESH_S)  # every process applies a stored policy within REFRESH_S
    yield
    Catalog().disable_auth()
    time.sleep(1.5 * REFRESH_S)  # the next module's clients present no token


@pytest.fixture(scope="module")
def admin(auth) -> ScalableTopicsAdmin:
    """The operator's admin: admin calls are checked by the cluster's admin service."""
    return ScalableTopicsAdmin(token=TOKENS["ops"])


@pytest.fixture
def topic(admin: ScalableTopicsAdmin, unique: str) -> Iterator[str]:
    name = f"topic://{NS}/t-{unique}"
    admin.create_scalable_topic(name, 2)
    admin.create_subscription(name, "s")
    admin.create_subscription(name, "q")
    yield name
    admin.delete_scalable_topic(name)


def internal() -> str:
    return guard().internal_token()


def segments(topic: str) -> list[Any]:
    name = TopicName.parse(topic)
    layout = Catalog().require_topic(name).layout
    return [
        segment_actor(name.segment(sid, s.hash_range.start, s.hash_range.end))
        for sid, s in sorted(layout.all_segments.items())
    ]


def state(topic: str) -> list[tuple[int, dict[str, Any]]]:
    """Each segment's end offset and cursors (acknowledged, backlog, in flight to queue
    consumers): what a refused client must not move."""
    found = []
    for handle in segments(topic):
        stats = ray.get(handle.stats.remote(credential=internal()))
        found.append((stats["endOffset"], stats["subscriptions"]))
    return found


def probe(topic: str, runs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Run tests/auth_probe.py in a process with no policy file and no token."""
    first = segments(topic)[0]
    endpoint = ray.get(first.data_endpoint.remote(credential=internal()))
    context = ray.get_runtime_context()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAYTOPICS_AUTH_TOKENS_FILE", "RAYTOPICS_TOKEN")
    }
    env |= {"RAY_ADDRESS": context.gcs_address, "RAYTOPICS_NAMESPACE": context.namespace}
    request = {
        "topic": topic,
        "segment": str(_segment_name(topic, 0)),
        "subscription": "s",
        "queue": "q",
        "endpoint": [endpoint.host, endpoint.port],
        "runs": runs,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.auth_probe"],
        input=json.dumps(request),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    return last_json(done.stdout)


def _segment_name(topic: str, index: int) -> SegmentName:
    name = TopicName.parse(topic)
    layout = Catalog().require_topic(name).layout
    sid, info = sorted(layout.all_segments.items())[index]
    return name.segment(sid, info.hash_range.start, info.hash_range.end)


def test_processes_without_a_good_token_are_refused_on_every_path(topic, kv_snapshot) -> None:
    with Producer(topic, token=TOKENS["app"]) as producer:
        producer.send_batch([b"m"] * 100, [f"k{i}" for i in range(100)]).result(timeout=60)
    before, kv_before = state(topic), kv_snapshot()
    wrong = "wrong-data-plane-token-0123456789"
    unauthenticated = {
        "no token": None,
        "empty token": "",
        "wrong token": wrong,
        "revoked token": TOKENS["revoked"],
        "wrong RAYTOPICS_TOKEN": f"$env:{wrong}",
    }
    runs = [{"label": label, "token": token} for label, token in unauthenticated.items()]
    runs.append({"label": "another namespace's token", "token": TOKENS["other"]})
    every_op = LOOKUP_OPS | PRODUCE_OPS | CONSUME_OPS | ADMIN_OPS
    runs += [  # short grants: only what they may not do (what they may would change things)
        {"label": name, "token": TOKENS[name], "operations": sorted(every_op - allowed)}
        for name, allowed in ALLOWED.items()
    ]
    results = probe(topic, runs)

    assert set(results["no token"]) == every_op, "the table names every operation tried"
    for label in unauthenticated:
        refused = {op: code for op, code in results[label].items() if code != "unauthenticated"}
        assert not refused, (label, refused)
    other = results["another namespace's token"]
    assert {op: c for op, c in other.items() if c != "forbidden"} == {}
    for name, allowed in ALLOWED.items():
        outcomes = {op: code for op, code in results[name].items() if op not in allowed}
        assert set(outcomes) == every_op - allowed
        assert {op: c for op, c in outcomes.items() if c != "forbidden"} == {}, name
    assert state(topic) == before, "a refused client stored, acknowledged or took something"
    assert kv_snapshot() == kv_before, "a refused client changed metadata"

    # The same process, environment and paths with a token that may: everything works.
    app = [
        "Producer",
        "Producer(transport=ray)",
        "StreamConsumer",
        "QueueConsumer",
        "CheckpointConsumer",
        "read_topic_dataset",
        "SegmentChannel",
        "ReadChannel",
    ]
    granted = probe(topic, [{"label": "app", "token": f"$env:{TOKENS['app']}", "operations": app}])
    assert granted["app"] == dict.fromkeys(app, "ok")


def test_waking_starts_only_a_hibernating_segment_of_the_layout(topic) -> None:
    """``wake_segment`` is a lookup: a client may ask it, and it starts nothing that is not
    a hibernating segment of the topic's layout."""
    name = TopicName.parse(topic)
    controller = controller_actor(name)
    looker = client_credential(TOKENS["looker"])
    alive = alive_actor_names(f"segment:{name.short}/")
    for segment_id in (0, 1, 2, 999, -1):  # running ones, ids not in the layout
        assert ray.get(controller.wake_segment.remote(segment_id, credential=looker)) is False
    assert alive_actor_names(f"segment:{name.short}/") == alive


def test_replication_controls_refuse_every_caller_but_the_system(topic) -> None:
    """Raw Ray calls to what only the system's controller asks: a segment's lead handed
    over (it would stop a segment taking appends), fenced or given a role, a
    transaction's marker written (it decides what every reader gets: an admin's token
    may not either), and a controller's round brought forward, with no token, a wrong
    one or one that may only look, are refused before anything happens; the segment then
    takes appends as before."""
    controller = controller_actor(TopicName.parse(topic))
    first = segments(topic)[0]
    wrong = client_credential("wrong-data-plane-token-0123456789")
    looker = client_credential(TOKENS["looker"])
    calls = (
        lambda c: controller.check_replicas.remote(credential=c),
        lambda c: first.hand_over.remote("any-disk", 0.1, credential=c),
        lambda c: first.fence.remote(99, credential=c),
        lambda c: first.lead.remote(99, 3, 2, credential=c),
        lambda c: first.mark.remote("txn-any", True, credential=c),  # a transaction's fate
    )
    for credential, error in ((None, UnauthenticatedError), (wrong, UnauthenticatedError),
                              (looker, UnauthorizedError)):  # fmt: skip
        for make_call in calls:
            with pytest.raises(error):
                ray.get(make_call(credential))
    with pytest.raises(UnauthorizedError, match="system's own credential"):  # admin's neither
        ray.get(first.mark.remote("txn-any", False, credential=client_credential(TOKENS["ops"])))
    with Producer(topic, token=TOKENS["writer"]) as producer:
        assert producer.send(b"still served", key="k").result(timeout=30) is not None


def test_a_controller_host_opens_a_controller_only_for_an_admin(topic) -> None:
    """A caller holding a controller host's handle (raw Ray access) that asks it to open a
    topic's controller, with no token, a wrong one or one that may only look, is refused
    and no controller, nor its directory entry, is made."""
    name = TopicName.parse(f"{topic}-never")
    opening = controller_actor(TopicName.parse(topic), create=True).opening
    handle = ControllerHandle(controller_actor(TopicName.parse(topic)).host, str(name), opening)
    wrong = client_credential("wrong-data-plane-token-0123456789")
    looker = client_credential(TOKENS["looker"])
    for credential, error in ((None, UnauthenticatedError), (wrong, UnauthenticatedError),
                              (looker, UnauthorizedError)):  # fmt: skip
        with pytest.raises(error):
            ray.get(handle.create.remote(2, credential=credential))
    assert ControllerDirectory().get(name) is None
    assert not Catalog().topic_exists(name)


def test_clients_fail_at_construction(topic) -> None:
    for token, error in (
        (None, UnauthenticatedError),
        ("", UnauthenticatedError),
        (TOKENS["revoked"], UnauthenticatedError),
        (TOKENS["other"], UnauthorizedError),
    ):
        with pytest.raises(error):
            Producer(topic, token=token)
        with pytest.raises(error):
            StreamConsumer(topic, "s", "c", token=token)
        with pytest.raises(error):
            QueueConsumer(topic, "q", token=token)
        with pytest.raises(error):
            CheckpointConsumer(topic, "g", "c", token=token)
    with pytest.raises(UnauthorizedError):
        Producer(topic, token=TOKENS["reader"])
    with pytest.raises(UnauthorizedError):
        StreamConsumer(topic, "s", "c", token=TOKENS["writer"])


async def _frames(reader: asyncio.StreamReader) -> list[bytes]:
    """Every frame until the segment closes the connection."""
    data = await asyncio.wait_for(reader.read(), timeout=15)
    bodies, start = [], 0
    while (frame := wire.frame_at(data, start, len(data))) is not None:
        body, start = frame
        bodies.append(data[body:start])
    assert start == len(data), "a partial frame"
    return bodies


def test_a_connection_carries_only_what_it_was_granted(topic) -> None:
    """Append frames need a connection granted produce, reads one granted consume, a
    replica's fetch one granted replicate (the system's own credential only); a HELLO
    asking for what the token may not have is refused. Each refusal closes it."""
    segment = segments(topic)[0]
    payload = serialize_batch(make_batch([b"sneaked"]))
    end = state(topic)[0][0]

    async def exchange(token: str, access: int, frame: bytes) -> list[bytes]:
        endpoint = await segment.data_endpoint.remote(credential=token)
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_hello(token, access) + frame)
        try:
            return await _frames(reader)
        finally:
            writer.close()

    read = wire.encode_read(wire.ReadRequest(0, 10, 0.0, "s", None))
    append = wire.encode_append(None, None, payload)
    consume_only = asyncio.run(exchange(TOKENS["app"], wire.CONSUME, append))
    assert wire.decode_welcome(consume_only[0]) == wire.CONSUME
    with pytest.raises(UnauthorizedError, match="consume only"):
        wire.decode_response(consume_only[1])
    txn_append = wire.encode_append(None, None, payload, "txn-" + "0" * 32)
    consume_only = asyncio.run(exchange(TOKENS["app"], wire.CONSUME, txn_append))
    with pytest.raises(UnauthorizedError, match="consume only"):
        wire.decode_response(consume_only[1])
    produce_only = asyncio.run(exchange(TOKENS["app"], wire.PRODUCE, read))
    with pytest.raises(UnauthorizedError, match="produce only"):
        wire.decode_records(produce_only[1])
    (refused,) = asyncio.run(exchange(TOKENS["reader"], wire.PRODUCE, append))
    with pytest.raises(UnauthorizedError):
        wire.decode_welcome(refused)
    # Posing as a replica of the segment: the system's own credential only, an admin's not
    fetch = encode_fetch(Fetch("impostor", 1, 1, 0))
    (refused,) = asyncio.run(exchange(TOKENS["ops"], wire.REPLICATE, fetch))
    with pytest.raises(UnauthorizedError, match="system's own credential"):
        wire.decode_welcome(refused)
    everything = asyncio.run(exchange(TOKENS["app"], wire.PRODUCE | wire.CONSUME, fetch))
    with pytest.raises(UnauthorizedError, match="produce and consume only, not replicate"):
        decode_shipment(everything[1])
    assert state(topic)[0][0] == end


def test_revoking_a_token_stops_running_clients_within_seconds(topic) -> None:
    """A revoked token stops producers (data plane and Ray calls) and a consumer; a grant
    cut to consume stops a producer with UnauthorizedError; all within 10 s."""
    victim, demoted = TOKENS["victim"], TOKENS["demoted"]
    tcp = Producer(topic, token=victim)
    over_ray = Producer(topic, token=victim, transport="ray")
    cut = Producer(topic, token=demoted)
    consumer = StreamConsumer(topic, "s", "victim", token=victim)
    for producer in (tcp, over_ray, cut):
        producer.send(b"before", key="k").result(timeout=60)
    assert consumer.receive(timeout=30) is not None
    try:
        revoked_at = time.monotonic()
        store_policy(without("revoked", "victim", demoted=[(NS, ["consume"])]))
        stopped = _until_refused(
            {
                "tcp producer": lambda: tcp.send(b"after", key="k").result(timeout=10),
                "ray producer": lambda: over_ray.send(b"after", key="k").result(timeout=10),
                "demoted producer": lambda: cut.send(b"after", key="k").result(timeout=10),
                "consumer": lambda: consumer.receive(timeout=0.2),
            },
            deadline=revoked_at + 10,
        )
        assert {label: type(err) for label, (err, _) in stopped.items()} == {
            "tcp producer": UnauthenticatedError,
            "ray producer": UnauthenticatedError,
            "demoted producer": UnauthorizedError,
            "consumer": UnauthenticatedError,
        }
        took = {label: round(at - revoked_at, 2) for label, (_, at) in stopped.items()}
        assert max(took.values()) < 10, took
        ends = [s[0] for s in state(topic)]
        for producer, error in ((tcp, UnauthenticatedError), (over_ray, UnauthenticatedError)):
            with pytest.raises(error):
                producer.send(b"later", key="k").result(timeout=10)
        with pytest.raises(UnauthenticatedError):
            consumer.receive(timeout=0.2)
        assert [s[0] for s in state(topic)] == ends, "a refused producer stored something"
    finally:
        store_policy(without("revoked"))
        for producer in (tcp, over_ray, cut):
            producer.close(timeout_s=5)
        consumer.close()


def _until_refused(attempts: dict[str, Any], deadline: float) -> dict[str, tuple[Exception, float]]:
    """Try each until it raises a refusal (or the deadline passes): the error and when."""
    stopped: dict[str, tuple[Exception, float]] = {}
    while len(stopped) < len(attempts) and time.monotonic() < deadline:
        for label, attempt in attempts.items():
            if label in stopped:
                continue
            try:
                attempt()
            except (UnauthenticatedError, UnauthorizedError) as err:
                stopped[label] = (err, time.monotonic())
        time.sleep(0.05)
    return stopped


def test_an_append_without_a_hello_is_refused_and_nothing_stored(topic) -> None:
    segment = segments(topic)[0]
    end = state(topic)[0][0]

    async def send() -> list[bytes]:
        endpoint = await segment.data_endpoint.remote(credential=TOKENS["app"])
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_append("p", 0, serialize_batch(make_batch([b"sneaked"]))))
        try:
            return await _frames(reader)
        finally:
            writer.close()

    (refusal,) = asyncio.run(send())
    with pytest.raises(UnauthenticatedError, match="HELLO"):
        wire.decode_response(refusal)
    assert state(topic)[0][0] == end


# --- garbage -----------------------------------------------------------------------------

_VALID_APPEND = wire.encode_append(None, None, serialize_batch(make_batch([b"garbage"])))


def _framed(body: bytes) -> bytes:
    return wire.LENGTH.pack(len(body)) + body


_frame = st.one_of(
    st.binary(max_size=64),  # anything at all
    st.binary(max_size=64).map(_framed),  # framed, any body
    st.tuples(st.integers(0, 255), st.binary(max_size=64)).map(
        lambda t: _framed(bytes([t[0]]) + t[1])  # any op byte
    ),
    st.just(_VALID_APPEND),  # a well-formed append, never behind an accepted HELLO
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.text(max_size=40)).map(
        lambda t: _framed(bytes([wire.OP_HELLO, t[0], t[1]]) + t[2].encode())  # garbled HELLO
    ),
    st.text(max_size=40).map(lambda t: wire.encode_hello(t, wire.PRODUCE)),  # unknown token
    st.integers(wire.MAX_HELLO + 1, 2**32 - 1).map(wire.LENGTH.pack),  # a huge length
    st.binary(min_size=1, max_size=16).map(lambda b: _framed(b)[:-1]),  # truncated
)
# A connection: garbage from its first byte, or a HELLO a consume-only token may send
# followed by appends (which it may not send). At least 4 frames each, so that the
# examples of the test below add up to 1,000 frames or more whatever hypothesis draws.
_MIN_FRAMES = 4
_connection = st.one_of(
    st.lists(_frame, min_size=_MIN_FRAMES, max_size=12),
    st.integers(_MIN_FRAMES - 1, 6).map(
        lambda n: [wire.encode_hello(TOKENS["reader"], wire.CONSUME), *[_VALID_APPEND] * n]
    ),
)


class _Steady:
    """A well-behaved producer, sending numbered messages in order under one key."""

    def __init__(self, topic: str) -> None:
        self.producer = Producer(topic, token=TOKENS["app"])
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            values = [str(self.sent + i).encode() for i in range(200)]
            try:
                self.producer.send_batch(values, ["one-key"] * 200).result(timeout=60)
            except Exception as err:  # noqa: BLE001 - the test reports it
                self.errors.append(err)
                return
            self.sent += 200

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        self.producer.close()
        return self.sent


@pytest.fixture
def single_segment(admin: ScalableTopicsAdmin, unique: str) -> Iterator[str]:
    name = f"topic://{NS}/fuzz-{unique}"
    admin.create_scalable_topic(name, 1)
    yield name
    admin.delete_scalable_topic(name)


def test_garbage_on_the_data_plane_stores_nothing_and_hurts_no_one(single_segment) -> None:
    topic = single_segment
    (segment,) = segments(topic)
    endpoint = ray.get(segment.data_endpoint.remote(credential=internal()))
    pid = ray.get(segment.ready.remote(credential=internal()))["pid"]
    steady = _Steady(topic)
    sent_frames = [0]

    @settings(
        max_examples=1_000 // _MIN_FRAMES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(_connection)
    def garbage(frames: list[bytes]) -> None:
        sent_frames[0] += len(frames)
        for body in asyncio.run(_send_garbage(endpoint, b"".join(frames))):
            # A welcome (the consume-only HELLO), else refusals: never an append's answer.
            if body[0] == wire.STATUS_OK:
                assert wire.decode_welcome(body) == wire.CONSUME
            else:
                assert isinstance(wire.decode_error(body), Exception)

    garbage()
    sent = steady.stop()
    assert not steady.errors, steady.errors
    assert sent_frames[0] >= 1_000
    assert ray.get(segment.ready.remote(credential=internal()))["pid"] == pid, "it restarted"
    values = []
    offset = 0
    while True:
        batch = ray.get(segment.read.remote(offset, 100_000, credential=internal()))
        if batch.num_rows == 0:
            break
        values += batch.column("value").to_pylist()
        offset += batch.num_rows
    assert sent > 0 and values == [str(i).encode() for i in range(sent)], "exactly, in order"


async def _send_garbage(endpoint: wire.Endpoint, data: bytes) -> list[bytes]:
    """Send ``data``, half-close, and return the frames answered before the segment closed."""
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        received = await asyncio.wait_for(reader.read(), timeout=15)
    except ConnectionError:
        received = b""
    finally:
        writer.close()
    bodies, start = [], 0
    while (frame := wire.frame_at(received, start, len(received))) is not None:
        body, start = frame
        bodies.append(bytes(received[body:start]))
    return bodies


def test_an_accepted_hello_lets_appends_through(topic) -> None:
    """The garbage test's premise: behind an accepted HELLO the same append is stored."""
    segment = segments(topic)[0]
    end = state(topic)[0][0]

    async def send() -> list[bytes]:
        endpoint = await segment.data_endpoint.remote(credential=TOKENS["app"])
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_hello(TOKENS["app"], wire.PRODUCE) + _VALID_APPEND)
        writer.write_eof()
        try:
            return await _frames(reader)
        finally:
            writer.close()

    welcome, appended = asyncio.run(send())
    assert wire.decode_welcome(welcome) == wire.PRODUCE
    assert wire.decode_response(appended) == (end, 1)


async def _answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The first ``count`` frames the segment sends (the connection stays open)."""
    data = b""
    while True:
        bodies, start = [], 0
        while (frame := wire.frame_at(data, start, len(data))) is not None:
            body, start = frame
            bodies.append(data[body:start])
        if len(bodies) >= count:
            return bodies[:count]
        chunk = await asyncio.wait_for(reader.read(1 << 16), timeout=30)
        assert chunk, f"the segment closed the connection after {len(bodies)} frames"
        data += chunk


def test_a_transactions_append_is_stored_only_in_an_open_transaction(topic) -> None:
    """Raw transactional appends behind an accepted HELLO: a transaction that does not
    exist, an id that is no name, an aborted one's, and a frame cut inside its id are
    each answered with their typed error, and nothing is stored; on the same connection
    an open transaction's append is then stored, and taken out of reach by its abort."""
    segment = segments(topic)[0]
    end = state(topic)[0][0]
    payload = serialize_batch(make_batch([b"sneaked"]))
    app = ScalableTopicsAdmin(token=TOKENS["app"])
    aborted, opened = app.new_transaction(timeout_s=60), app.new_transaction(timeout_s=60)
    aborted.abort()
    cut = wire.encode_append(None, None, payload, "txn-cut")
    cut_short = _framed(cut[wire.LENGTH.size : wire.LENGTH.size + 3 + 8 + 1 + 3])
    refused = [
        wire.encode_append(None, None, payload, "txn-" + "0" * 32),
        wire.encode_append(None, None, payload, "../../auth"),
        wire.encode_append(None, None, payload, aborted.id),
        cut_short,
    ]

    async def exchange(frames: list[bytes]) -> list[bytes]:
        endpoint = await segment.data_endpoint.remote(credential=TOKENS["app"])
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(wire.encode_hello(TOKENS["app"], wire.PRODUCE) + b"".join(frames))
        try:
            return await _answers(reader, 1 + len(frames))
        finally:
            writer.close()

    welcome, *answers = asyncio.run(exchange(refused))
    assert wire.decode_welcome(welcome) == wire.PRODUCE
    errors = (TransactionNotFoundError, InvalidNameError, TransactionNotOpenError,
              InvalidArgumentError)  # fmt: skip
    for answer, error in zip(answers, errors, strict=True):
        with pytest.raises(error):
            wire.decode_response(answer)
    assert state(topic)[0][0] == end
    good = wire.encode_append(None, None, payload, opened.id)
    _, stored = asyncio.run(exchange([good]))
    assert wire.decode_response(stored) == (end, 1)
    opened.abort()
    assert ray.get(segment.read.remote(end, 10, credential=internal())).num_rows == 0
