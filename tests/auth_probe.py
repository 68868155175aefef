"""A client process for the authentication tests: tries each client path with each token.

Run as ``python -m tests.auth_probe`` with a JSON request on stdin (the topic,
its segments, the data plane's address, and the tokens to try under their
labels) and an environment that names no policy file and no token; prints one
JSON line: for every label and operation, ``"ok"`` or the code of the error
that stopped it. Being its own process is the point: whatever this process's
environment says (nothing, here), only the cluster's stored policy decides.

Each run is ``{"label", "token", "operations"}``: a ``null`` token presents none;
``"$env:TOKEN"`` passes no token and puts TOKEN in ``RAYTOPICS_TOKEN`` (the
clients' default, which the channels and raw calls here resolve as clients do);
``operations`` lists the labels to try (``null``: all).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.auth import client_credential  # noqa: E402
from runtime.errors import ScalableTopicsError  # noqa: E402

OPERATION_TIMEOUT_S = 30.0


class Probe:
    def __init__(self, request: dict[str, Any]) -> None:
        from actors.control.controller_host import controller_actor
        from actors.control.coordinator_host import coordinator_actor
        from actors.control.dag_watch import dag_watch_actor
        from actors.segment.lookup import segment_actor
        from runtime.names import SegmentName, TopicName

        self.request = request
        self.topic = request["topic"]
        name = TopicName.parse(self.topic)
        self.segment = segment_actor(SegmentName.parse(request["segment"]))
        self.coordinator = coordinator_actor(name, request["subscription"])
        self.watch = dag_watch_actor()
        self.controller = controller_actor(name)
        self.endpoint = tuple(request["endpoint"])

    # --- client paths ---------------------------------------------------------------

    def producer(self, token: str | None, transport: str = "tcp") -> None:
        from clients import Producer

        with Producer(self.topic, token=token, transport=transport) as producer:
            producer.send(b"intruder", key="k").result(timeout=OPERATION_TIMEOUT_S)

    def stream(self, token: str | None) -> None:
        from clients import StreamConsumer

        consumer = StreamConsumer(self.topic, self.request["subscription"], "intruder", token=token)
        try:
            consumer.receive(timeout=2.0)
        finally:
            consumer.close()

    def queue(self, token: str | None) -> None:
        from clients import QueueConsumer

        consumer = QueueConsumer(self.topic, self.request["queue"], token=token)
        try:
            consumer.receive(timeout=2.0)
        finally:
            consumer.close()

    def checkpoint(self, token: str | None) -> None:
        from clients import CheckpointConsumer

        consumer = CheckpointConsumer(self.topic, "intruder-group", "c", token=token)
        try:
            consumer.receive(timeout=2.0)
        finally:
            consumer.close()

    def bulk_read(self, token: str | None) -> None:
        from clients.ray_data import read_topic_dataset

        read_topic_dataset(self.topic, token=token).take_all()

    def segment_channel(self, token: str | None) -> None:
        from clients._data_plane import SegmentChannel
        from runtime.batch import make_batch, serialize_batch

        async def append() -> None:
            credential = client_credential(token)
            channel = SegmentChannel(self.segment, credential=credential, reconnect_attempts=1)
            try:
                payload = serialize_batch(make_batch([b"intruder"]))
                await asyncio.wait_for(channel.append(None, None, payload), OPERATION_TIMEOUT_S)
            finally:
                await channel.close()

        asyncio.run(append())

    def read_channel(self, token: str | None) -> None:
        from clients._data_plane import ReadChannel
        from runtime import wire

        async def read() -> None:
            channel = ReadChannel(self.segment, credential=client_credential(token))
            try:
                request = wire.ReadRequest(0, 10, 0.0, self.request["subscription"], 0)
                await channel.read(request)
            finally:
                channel.close()

        asyncio.run(read())

    def queue_channel(self, token: str | None, settle: bool) -> None:
        """A queue consumer's take, or its acknowledgement, over the data plane."""
        from clients._data_plane import ReadChannel
        from runtime import wire

        async def ask() -> None:
            channel = ReadChannel(self.segment, credential=client_credential(token))
            queue = self.request["queue"]
            try:
                if settle:
                    ack = wire.SettleRequest(wire.Settle.ACK, queue, "intruder", [0])
                    await channel.settle(ack)
                else:
                    await channel.take(wire.TakeRequest(queue, "intruder", 10, 0.0))
            finally:
                channel.close()

        asyncio.run(ask())

    def raw_data_plane(self, token: str | None) -> None:
        """A HELLO with this token and a well-formed append behind it, on a bare socket."""
        from runtime import wire
        from runtime.batch import make_batch, serialize_batch

        frames = wire.encode_hello(client_credential(token), wire.PRODUCE) + wire.encode_append(
            None, None, serialize_batch(make_batch([b"intruder"]))
        )
        with socket.create_connection(self.endpoint, timeout=OPERATION_TIMEOUT_S) as sock:
            sock.sendall(frames)
            received = b""
            while chunk := sock.recv(1 << 16):
                received += chunk
        (length,) = wire.LENGTH.unpack_from(received)
        body = received[4 : 4 + length]
        if len(received) != 4 + length:
            raise AssertionError(f"more than one answer to a refused HELLO: {received!r}")
        wire.decode_welcome(body)  # raises the refusal

    # --- actor methods ------------------------------------------------------------------

    def calls(self, token: str | None) -> dict[str, Callable[[], Any]]:
        """Every segment, coordinator and DAG watch method a client or actor may call."""
        from runtime.batch import make_batch

        c = client_credential(token)
        seg, coord, watch = self.segment, self.coordinator, self.watch
        sub = self.request["subscription"]
        return {
            "segment.append": lambda: seg.append.remote(make_batch([b"x"]), credential=c),
            "segment.append(txn)": lambda: seg.append.remote(
                make_batch([b"x"]), txn_id="txn-probe", credential=c
            ),
            "segment.ack": lambda: seg.ack.remote(sub, [0], credential=c),
            "segment.read": lambda: seg.read.remote(0, 10, credential=c),
            "segment.ack_cumulative": lambda: seg.ack_cumulative.remote(sub, 5, credential=c),
            "segment.position": lambda: seg.position.remote(sub, credential=c),
            "segment.data_endpoint": lambda: seg.data_endpoint.remote(credential=c),
            "segment.ready": lambda: seg.ready.remote(credential=c),
            "segment.stats": lambda: seg.stats.remote(credential=c),
            "segment.subscriptions": lambda: seg.subscriptions.remote(credential=c),
            "segment.check_epoch": lambda: seg.check_epoch.remote(0, credential=c),
            "segment.create_subscription": lambda: seg.create_subscription.remote(
                "intruder-sub", credential=c
            ),
            "segment.delete_subscription": lambda: seg.delete_subscription.remote(
                sub, credential=c
            ),
            "segment.seek": lambda: seg.seek.remote(sub, "latest", credential=c),
            "segment.retain": lambda: seg.retain.remote(None, 1, credential=c),
            "segment.terminate": lambda: seg.terminate.remote(credential=c),
            "segment.delete": lambda: seg.delete.remote(credential=c),
            # the host's own methods: a segment opened, closed, or opened by a call
            "host.open": lambda: seg.host.open.remote(seg.segment, self._opening(c)),
            "host.close": lambda: seg.host.close.remote(seg.segment, time.time_ns(), credential=c),
            "host.close_topic": lambda: seg.host.close_topic.remote(
                self.topic, time.time_ns(), credential=c
            ),
            "host.call(opening)": lambda: seg.host.call.remote(
                seg.segment.replace("0000-", "0001-"), "ready", self._opening(c), credential=c
            ),
            "coordinator.register": lambda: coord.register.remote("intruder", credential=c),
            "coordinator.poll": lambda: coord.poll.remote("intruder", -1, 0.1, credential=c),
            "coordinator.release": lambda: coord.release.remote("intruder", 0, credential=c),
            "coordinator.finished": lambda: coord.finished.remote("intruder", 0, credential=c),
            "coordinator.unregister": lambda: coord.unregister.remote("intruder", credential=c),
            "coordinator.reset": lambda: coord.reset.remote([0], {}, credential=c),
            "coordinator.snapshot": lambda: coord.snapshot.remote(credential=c),
            "coordinator.ensure_group": lambda: coord.ensure_group.remote(60.0, credential=c),
            "coordinators.stop": lambda: coord.host.stop.remote(self.topic, sub, credential=c),
            "coordinators.stop_topic": lambda: coord.host.stop.remote(self.topic, credential=c),
            "dagwatch.listen": lambda: watch.listen.remote(self.topic, None, 0.5, credential=c),
            "dagwatch.layout": lambda: watch.layout.remote(self.topic, credential=c),
            "dagwatch.notify": lambda: watch.notify.remote(self.topic, credential=c),
            "controller.wake_segment": lambda: self.controller.wake_segment.remote(0, credential=c),
        }

    def _opening(self, credential: str | None) -> Any:
        """What a host is told to open a segment with, under ``credential``."""
        from actors.segment.handle import Opening

        stolen = self.segment.opening or Opening("/tmp", {}, False, "x", 0, None)
        return Opening("/tmp/intruder", stolen.durability, False, "x", time.time_ns(), credential)

    def run(self, token: str | None, operations: list[str] | None) -> dict[str, str]:
        import ray

        outcomes: dict[str, str] = {}
        paths: dict[str, Callable[[], Any]] = {
            "Producer": lambda: self.producer(token),
            "Producer(transport=ray)": lambda: self.producer(token, "ray"),
            "StreamConsumer": lambda: self.stream(token),
            "QueueConsumer": lambda: self.queue(token),
            "CheckpointConsumer": lambda: self.checkpoint(token),
            "read_topic_dataset": lambda: self.bulk_read(token),
            "SegmentChannel": lambda: self.segment_channel(token),
            "ReadChannel": lambda: self.read_channel(token),
            "take": lambda: self.queue_channel(token, settle=False),
            "settle": lambda: self.queue_channel(token, settle=True),
            "raw data plane": lambda: self.raw_data_plane(token),
        }
        for label, call in self.calls(token).items():
            paths[label] = lambda call=call: ray.get(call(), timeout=OPERATION_TIMEOUT_S)
        for label, path in paths.items():
            if operations is None or label in operations:
                outcomes[label] = _outcome(path)
        return outcomes


def _outcome(path: Callable[[], Any]) -> str:
    from ray.exceptions import RayTaskError

    try:
        path()
    except ScalableTopicsError as err:
        return err.code
    except RayTaskError as err:
        cause = err.cause
        return cause.code if isinstance(cause, ScalableTopicsError) else f"{type(cause).__name__}"
    except Exception as err:  # noqa: BLE001 - reported, the test decides
        return f"{type(err).__name__}: {err}"
    return "ok"


def main() -> None:
    from runtime import connect

    request = json.loads(sys.stdin.read())
    connect(log_to_driver=False)
    probe = Probe(request)
    results: dict[str, dict[str, str]] = {}
    for run in request["runs"]:
        token = run["token"]
        os.environ.pop("RAYTOPICS_TOKEN", None)
        if isinstance(token, str) and token.startswith("$env:"):
            os.environ["RAYTOPICS_TOKEN"] = token.removeprefix("$env:")
            token = None
        results[run["label"]] = probe.run(token, run.get("operations"))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
