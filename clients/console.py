"""Console tools, as Kafka's ``kafka-console-producer`` / ``-consumer`` and ``top``:
``raytopics produce``, ``raytopics consume`` and ``raytopics top``.

They are thin shells over the clients: ``produce`` reads lines from stdin and sends
them in batches through a ``Producer`` (the vectorized ``send_batch`` path, so a
pipe of a million lines is not a million calls); ``consume`` is a ``StreamConsumer``
that prints what it receives and acknowledges it once printed; ``top`` polls
``get_stats`` and turns the change in record counts into rates. ``clients.cli``
wires them to the command line; nothing here parses arguments.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

from clients.message import Message
from runtime.errors import InvalidArgumentError, SubscriptionAlreadyExistsError

# Lines per send_batch call: large enough to make the batch path pay, small enough
# that a slow stdin still reaches the topic promptly.
PRODUCE_CHUNK = 1_000
RECEIVE_CHUNK = 1_000
POLL_S = 0.5

KeyOf = Callable[[int, bytes], str | None]


# --- produce ------------------------------------------------------------------------


def key_of(fixed: str | None, field: str | None) -> KeyOf:
    """How a line gets its key: none, a fixed key, or a field of the line read as a
    JSON object. A line without that field fails naming its number."""
    if fixed is not None:
        return lambda _number, _line: fixed
    if field is None:
        return lambda _number, _line: None

    def from_field(number: int, line: bytes) -> str:
        try:
            record = json.loads(line)
        except ValueError:
            raise InvalidArgumentError(
                f"line {number} is not a JSON object, so it has no field {field!r} for --key-field"
            ) from None
        if not isinstance(record, dict) or field not in record:
            raise InvalidArgumentError(f"line {number} has no field {field!r} for --key-field")
        value = record[field]
        return value if isinstance(value, str) else json.dumps(value)

    return from_field


def chunks(lines: Iterable[bytes], size: int) -> Iterator[list[tuple[int, bytes]]]:
    """Numbered non-empty lines (end of line removed), ``size`` at a time."""
    chunk: list[tuple[int, bytes]] = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip(b"\r\n")
        if not line:
            continue
        chunk.append((number, line))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class Pacer:
    """Holds a sender to ``rate`` messages a second on average (None: no limit)."""

    rate: float | None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self._started = self.clock()
        self._sent = 0

    def sent(self, count: int) -> None:
        self._sent += count
        if self.rate:
            ahead = self._sent / self.rate - (self.clock() - self._started)
            if ahead > 0:
                self.sleep(ahead)


def produce(
    topic: str,
    lines: BinaryIO,
    *,
    key: KeyOf,
    rate: float | None,
    token: str | None,
) -> int:
    """Send every non-empty line of ``lines`` to ``topic``; returns how many were stored.
    A line refused (no key field) stops the run after what came before it is stored."""
    from clients.producer import Producer

    if rate is not None and rate <= 0:
        raise InvalidArgumentError(f"--rate must be positive, got {rate}")
    size = PRODUCE_CHUNK if rate is None else max(1, min(PRODUCE_CHUNK, int(rate / 10)))
    pacer = Pacer(rate)
    sent = 0
    futures = []
    with Producer(topic, token=token) as producer:
        for chunk in chunks(lines, size):
            values: list[bytes] = []
            keys: list[str | None] = []
            try:
                for number, line in chunk:
                    keys.append(key(number, line))
                    values.append(line)
            finally:  # a refused line: the lines before it still go
                if values:
                    futures.append(producer.send_batch(values, keys=keys))
                    sent += len(values)
                    pacer.sent(len(values))
    for future in futures:
        future.result()  # raises the first failure, typed
    return sent


# --- consume ------------------------------------------------------------------------


def as_json(message: Message) -> str:
    """One message as a JSON line; a value that is not UTF-8 goes as base64."""
    record: dict[str, Any] = {
        "key": message.key,
        "segment": message.segment_id,
        "offset": message.offset,
        "publishTime": message.publish_time.isoformat(),
        "properties": message.properties,
    }
    try:
        record["value"] = message.value.decode()
    except UnicodeDecodeError:
        record["valueBase64"] = base64.b64encode(message.value).decode()
    return json.dumps(record)


def as_text(message: Message) -> str:
    return message.value.decode(errors="replace")


@dataclass
class ConsumeRun:
    topic: str
    subscription: str | None
    start: str
    max_messages: int | None
    idle_timeout_s: float | None
    json_lines: bool
    token: str | None


def consume(admin: Any, run: ConsumeRun, out: TextIO, say: TextIO) -> int:
    """Print what ``run.subscription`` receives (a new one starts at ``run.start``; with
    none given, a temporary subscription that is deleted afterwards) until
    ``max_messages`` or ``idle_timeout_s`` without a message; returns the count."""
    from clients.stream_consumer import StreamConsumer

    temporary = run.subscription is None
    subscription = run.subscription or f"console-{uuid.uuid4().hex[:8]}"
    try:
        admin.create_subscription(run.topic, subscription, run.start)
    except SubscriptionAlreadyExistsError:
        print(
            f"subscription {subscription} exists: it resumes at its cursors (--from applies "
            "to a new one; `raytopics subscriptions reset` moves an existing one)",
            file=say,
        )
    consumer = None
    try:
        consumer = StreamConsumer(
            run.topic, subscription, f"console-{uuid.uuid4().hex[:8]}", token=run.token
        )
        return _print_messages(consumer, run, out)
    finally:
        if consumer is not None:
            consumer.close()
        if temporary:
            admin.delete_subscription(run.topic, subscription)


def _print_messages(consumer: Any, run: ConsumeRun, out: TextIO) -> int:
    render = as_json if run.json_lines else as_text
    count = 0
    idle_since = time.monotonic()
    while run.max_messages is None or count < run.max_messages:
        want = RECEIVE_CHUNK if run.max_messages is None else run.max_messages - count
        batch = consumer.receive_batch(min(want, RECEIVE_CHUNK), timeout=POLL_S)
        if not batch:
            if run.idle_timeout_s is not None and (
                time.monotonic() - idle_since >= run.idle_timeout_s
            ):
                break
            continue
        out.write("".join(render(m) + "\n" for m in batch))
        out.flush()
        consumer.acknowledge_cumulative(batch)  # printed, so done with
        count += len(batch)
        idle_since = time.monotonic()
    return count


# --- top ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicSample:
    """What ``top`` shows of a topic, from one ``get_stats``."""

    topic: str
    active: int
    sealed: int
    records: int
    acknowledged: int  # by all subscriptions together: records x subscriptions - backlog
    backlog: int
    subscriptions: int
    consumers: int
    at: float

    @classmethod
    def of(cls, stats: dict[str, Any], at: float) -> TopicSample:
        subs = stats["subscriptions"].values()
        backlog = sum(s["backlog"] for s in subs)
        return cls(
            topic=stats["topic"],
            active=stats["activeSegments"],
            sealed=stats["sealedSegments"],
            records=stats["records"],
            acknowledged=stats["records"] * len(stats["subscriptions"]) - backlog,
            backlog=backlog,
            subscriptions=len(stats["subscriptions"]),
            consumers=sum(s["consumers"] for s in subs),
            at=at,
        )


def rate(now: TopicSample, before: TopicSample | None, field: str) -> float | None:
    """Per second between two samples of one topic; None without an earlier one (or
    when retention took records, which would read as a negative rate)."""
    if before is None or now.at <= before.at:
        return None
    change = getattr(now, field) - getattr(before, field)
    return change / (now.at - before.at) if change >= 0 else None


def top_table(samples: list[TopicSample], before: dict[str, TopicSample]) -> str:
    header = (
        f"{'TOPIC':<40} {'ACTIVE':>6} {'SEALED':>6} {'IN/S':>9} {'OUT/S':>9} "
        f"{'RECORDS':>10} {'BACKLOG':>9} {'SUBS':>4} {'CONS':>4}"
    )
    lines = [header]
    for s in sorted(samples, key=lambda s: s.topic):
        rates = [rate(s, before.get(s.topic), f) for f in ("records", "acknowledged")]
        shown = ["-" if r is None else f"{r:,.0f}" for r in rates]
        lines.append(
            f"{s.topic:<40} {s.active:>6} {s.sealed:>6} {shown[0]:>9} {shown[1]:>9} "
            f"{s.records:>10} {s.backlog:>9} {s.subscriptions:>4} {s.consumers:>4}"
        )
    if not samples:
        lines.append("(no topics)")
    return "\n".join(lines)


def sample_topics(admin: Any, namespaces: list[str]) -> list[TopicSample]:
    samples = []
    for namespace in namespaces:
        for topic in admin.list_scalable_topics(namespace):
            samples.append(TopicSample.of(admin.get_stats(topic), time.monotonic()))
    return samples


def top(
    admin: Any,
    namespaces: list[str],
    *,
    interval_s: float,
    rounds: int | None,
    out: TextIO,
) -> None:
    """Redraw the table every ``interval_s`` (``rounds`` times, or until Ctrl-C); on a
    terminal the screen is cleared between tables, elsewhere tables follow each other."""
    clear = "\x1b[H\x1b[2J" if out.isatty() else ""
    before: dict[str, TopicSample] = {}
    shown = 0
    while rounds is None or shown < rounds:
        if shown:
            time.sleep(interval_s)
        samples = sample_topics(admin, namespaces)
        stamp = time.strftime("%H:%M:%S")
        out.write(f"{clear}raytopics top - {stamp} - every {interval_s:g}s\n")
        out.write(top_table(samples, before) + "\n\n")
        out.flush()
        before = {s.topic: s for s in samples}
        shown += 1
