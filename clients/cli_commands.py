"""The ``raytopics`` commands (``clients.cli``): each takes the admin (a Ray driver's
``ScalableTopicsAdmin`` or REST's ``AdminHttpClient``, which have the same methods) and
the parsed arguments, and returns what to print; and how the CLI opens that admin.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from clients.cli_format import format_auth, format_stats, format_storage, format_tree
from runtime.errors import InvalidArgumentError, UnavailableError
from runtime.hashing import key_hash
from runtime.subscription import ResetTo

Command = Callable[[Any, argparse.Namespace], str]


def calls(*methods: str) -> Callable[[Command], Command]:
    """Declare the Admin Client API methods a command calls: those get no generated
    command of their own (``clients.cli_calls``)."""

    def declare(command: Command) -> Command:
        command.calls = methods  # type: ignore[attr-defined]
        return command

    return declare


def claimed() -> set[str]:
    """Every Admin Client API method some command of this module calls."""
    return {m for command in list(globals().values()) for m in getattr(command, "calls", ())}


# --- commands (each returns what to print) --------------------------------------------


@calls("create_scalable_topic", "wait_until_ready")
def create_topic(admin: Any, args: argparse.Namespace) -> str:
    meta = admin.create_scalable_topic(args.topic, args.segments, dict(args.property) or None)
    created = f"created {args.topic} with {args.segments} segments\n{format_tree(meta)}"
    if args.wait is None:
        return (
            f"{created}\nits segments start in the background "
            f"(raytopics status {args.topic} --wait SECONDS waits for them)"
        )
    return f"{created}\n{_readiness(admin.wait_until_ready(args.topic, args.wait))}"


@calls("get_status", "wait_until_ready")
def status(admin: Any, args: argparse.Namespace) -> str:
    if args.wait is None:
        readiness = admin.get_status(args.topic)
    else:
        readiness = admin.wait_until_ready(args.topic, args.wait)
    return json.dumps(readiness, indent=2) if args.json else _readiness(readiness)


def _readiness(readiness: dict[str, Any]) -> str:
    running = f"{readiness['running']} of {readiness['segments']} segments running"
    if readiness["state"] == "ready":
        return f"ready: {running}"
    waiting = ", ".join(f"#{s}" for s in readiness["notRunning"])
    return f"starting: {running}; not yet: {waiting}"


@calls("list_scalable_topics")
def list_topics(admin: Any, args: argparse.Namespace) -> str:
    topics = admin.list_scalable_topics(args.namespace_path)
    return "\n".join(topics) if topics else f"no topics in {args.namespace_path}"


@calls("get_metadata")
def describe(admin: Any, args: argparse.Namespace) -> str:
    meta = admin.get_metadata(args.topic)
    if args.json:
        return json.dumps(meta, indent=2)
    properties = ", ".join(f"{k}={v}" for k, v in sorted(meta.get("properties", {}).items()))
    return f"{args.topic}\n{format_tree(meta)}" + (
        f"\nproperties: {properties}" if properties else ""
    )


@calls("split_segment")
def split(admin: Any, args: argparse.Namespace) -> str:
    op = admin.split_segment(args.topic, args.segment_id, at=args.at, parts=args.parts)
    *rest, last = [f"#{c}" for c in op["children"]]
    children = f"{', '.join(rest)} and {last}"
    return f"split #{args.segment_id} of {args.topic} into {children} (epoch {op['epoch']})"


def key_hashes(args: argparse.Namespace) -> str:
    """Each key's hash in hex and decimal: what ``split --at`` takes."""
    return "\n".join(f"{(h := key_hash(key)):#06x}\t{h}\t{key}" for key in args.keys)


@calls("merge_segments")
def merge(admin: Any, args: argparse.Namespace) -> str:
    ids = (args.segment_id1, args.segment_id2, *args.more_segment_ids)
    op = admin.merge_segments(args.topic, *ids)
    *rest, last = [f"#{i}" for i in ids]
    return (
        f"merged {', '.join(rest)} and {last} of {args.topic} "
        f"into #{op['children'][0]} (epoch {op['epoch']})"
    )


@calls("get_stats")
def stats(admin: Any, args: argparse.Namespace) -> str:
    stats = admin.get_stats(args.topic)
    return json.dumps(stats, indent=2) if args.json else format_stats(stats)


@calls("delete_scalable_topic")
def delete_topic(admin: Any, args: argparse.Namespace) -> str:
    admin.delete_scalable_topic(args.topic)
    return f"deleted {args.topic}"


@calls("create_subscription")
def subscription_create(admin: Any, args: argparse.Namespace) -> str:
    admin.create_subscription(args.topic, args.subscription, args.position, args.session_grace_s)
    return f"created subscription {args.subscription} on {args.topic} at {args.position}"


@calls("delete_subscription")
def subscription_delete(admin: Any, args: argparse.Namespace) -> str:
    admin.delete_subscription(args.topic, args.subscription)
    return f"deleted subscription {args.subscription} of {args.topic}"


def reset_to(value: str) -> ResetTo:
    """``earliest``, ``latest``, epoch milliseconds, or an ISO 8601 time with a zone."""
    if value in ("earliest", "latest"):
        return value  # type: ignore[return-value]
    if value.isdigit():
        return int(value)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected earliest, latest, epoch milliseconds or an ISO 8601 time "
            "with a zone (2026-11-26T10:00:00+00:00)"
        ) from None


@calls("reset_subscription")
def subscription_reset(admin: Any, args: argparse.Namespace) -> str:
    done = admin.reset_subscription(args.topic, args.subscription, args.to)
    finished = len(done["finishedSegments"])
    future = (
        " (a time still to come: every cursor at its segment's end)" if done["inTheFuture"] else ""
    )
    return (
        f"reset subscription {args.subscription} of {args.topic} to {args.to}: "
        f"{len(done['positions'])} segments, {finished} finished{future}"
    )


@calls("clear_backlog")
def subscription_clear(admin: Any, args: argparse.Namespace) -> str:
    admin.clear_backlog(args.topic, args.subscription)
    return f"cleared the backlog of subscription {args.subscription} of {args.topic}"


@calls("list_subscriptions")
def subscription_list(admin: Any, args: argparse.Namespace) -> str:
    return "\n".join(admin.list_subscriptions(args.topic))


@calls("set_namespace_limits", "get_namespace_limits")
def limits(admin: Any, args: argparse.Namespace) -> str:
    """Show a namespace's limits; with ``--set`` override some first (validated whole)."""
    if args.set:
        limits = admin.set_namespace_limits(args.namespace_path, **dict(args.set))
    else:
        limits = admin.get_namespace_limits(args.namespace_path)
    width = max(map(len, limits))
    return "\n".join(f"{name:<{width}}  {value}" for name, value in limits.items())


@calls("get_policy")
def policy_show(admin: Any, args: argparse.Namespace) -> str:
    return json.dumps(admin.get_policy(args.topic), indent=2)


@calls("set_policy")
def policy_set(admin: Any, args: argparse.Namespace) -> str:
    stored = admin.set_policy(args.topic, args.policy)
    return f"policy of {args.topic} is now\n{json.dumps(stored, indent=2)}"


@calls("get_namespace_policy")
def policy_show_default(admin: Any, args: argparse.Namespace) -> str:
    return json.dumps(admin.get_namespace_policy(args.namespace_path), indent=2)


@calls("set_namespace_policy")
def policy_set_default(admin: Any, args: argparse.Namespace) -> str:
    stored = admin.set_namespace_policy(args.namespace_path, args.policy)
    return f"default policy of {args.namespace_path} is now\n{json.dumps(stored, indent=2)}"


@calls("check_storage")
def storage_check(admin: Any, args: argparse.Namespace) -> str:
    report = admin.check_storage(delete=args.delete)
    return json.dumps(report, indent=2) if args.json else format_storage(report)


@calls("recover_topic")
def recover(admin: Any, args: argparse.Namespace) -> str:
    done = admin.recover_topic(args.topic, args.incarnation)
    if args.json:
        return json.dumps(done, indent=2)
    finished = (
        f"; finished an interrupted {done['finishedOperation']}"
        if done["finishedOperation"]
        else ""
    )
    subscriptions = ", ".join(done["subscriptions"]) or "none"
    return (
        f"recovered {done['topic']} (incarnation {done['incarnation']}) at epoch "
        f"{done['epoch']}: {done['activeSegments']} active of {done['segments']} segments, "
        f"subscriptions: {subscriptions}{finished}"
    )


@calls("load_auth")
def auth_load(admin: Any, args: argparse.Namespace) -> str:
    status = admin.load_auth(_read_json(args.file))
    return f"loaded {args.file}\n{format_auth(status)}"


@calls("auth_status")
def auth_show(admin: Any, args: argparse.Namespace) -> str:
    status = admin.auth_status()
    return json.dumps(status, indent=2) if args.json else format_auth(status)


@calls("disable_auth")
def auth_disable(admin: Any, args: argparse.Namespace) -> str:
    admin.disable_auth()
    return "authentication is off: anyone who reaches the cluster may do anything"


def produce(admin: Any, args: argparse.Namespace) -> str:
    from clients import console

    key = console.key_of(args.key, args.key_field)
    sent = console.produce(
        args.topic, sys.stdin.buffer, key=key, rate=args.rate, token=_token(args)
    )
    print(f"produced {sent} messages to {args.topic}", file=sys.stderr)
    return ""


def consume(admin: Any, args: argparse.Namespace) -> str:
    from clients import console

    run = console.ConsumeRun(
        topic=args.topic,
        subscription=args.subscription,
        start=args.start,
        max_messages=args.max,
        idle_timeout_s=args.timeout,
        json_lines=args.json,
        token=_token(args),
    )
    count = console.consume(admin, run, args.out, sys.stderr)
    print(f"consumed {count} messages from {args.topic}", file=sys.stderr)
    return ""


def top(admin: Any, args: argparse.Namespace) -> str:
    from clients import console

    rounds = 1 if args.once else None
    console.top(admin, args.namespaces, interval_s=args.interval, rounds=rounds, out=args.out)
    return ""


def _read_json(path: str) -> Any:
    from runtime.errors import InvalidArgumentError

    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError) as err:
        raise InvalidArgumentError(f"cannot read {path}: {err}") from None


def serve(args: argparse.Namespace) -> str:
    """Run the gateway until Ctrl-C/SIGTERM; the gateway lives exactly as long as this."""
    from actors.gateway.server import gateway_id, start_gateway, stop_gateway

    _connect(args)
    stop = _stop_signal()  # before the banner: whoever reads it may signal at once
    url = start_gateway(args.port, args.host, existing="replace" if args.replace else "refuse")
    ours = gateway_id(args.port)
    print(
        f"serving the admin API at {url} (see {url}/openapi.json) and the web console at "
        f"{url}/; Ctrl-C stops",
        file=args.out,
        flush=True,
    )
    while not stop.wait(0.5):
        pass
    if not stop_gateway(args.port, only=ours):
        return f"stopped (the gateway on port {args.port} had been replaced; it keeps serving)"
    return "stopped"


# --- connecting -------------------------------------------------------------------------


def _connect(args: argparse.Namespace) -> None:
    """Join Ray where ``connect()`` would: ``--address`` when given, else
    ``RAY_ADDRESS``, else a cluster started with ``ray start``, else the embedded Ray
    of the storage root, started if none runs and shared with every other program
    using that root. ``serve`` reports which Ray it chose; the other commands print
    only results."""
    from runtime.connect import connect

    address = args.address
    level = logging.INFO if args.command == "serve" else logging.WARNING
    try:
        connect(address, namespace=args.namespace, logging_level=level, log_to_driver=False)
    except ConnectionError as err:
        where = args.address or "the Ray connect() chose"
        raise UnavailableError(f"cannot connect to {where}: {err}") from None


def open_admin(args: argparse.Namespace) -> Any:
    token = _token(args)
    if args.url:
        from clients.http import AdminHttpClient

        return AdminHttpClient(args.url, ca=args.ca, token=token)
    _connect(args)
    from clients.admin import ScalableTopicsAdmin

    return ScalableTopicsAdmin(address=args.address, namespace=args.namespace, token=token)


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``--token-file``'s first line, else ``None`` (``RAYTOPICS_TOKEN``):
    the rest of the file is not read."""
    if args.token is not None:
        return args.token
    if args.token_file is None:
        return None
    try:
        with open(args.token_file) as file:
            token = file.readline().strip()
    except OSError as err:
        raise InvalidArgumentError(f"cannot read --token-file {args.token_file}: {err}") from None
    if not token:
        raise InvalidArgumentError(f"--token-file {args.token_file}: its first line is empty")
    return token


def _stop_signal() -> threading.Event:
    """An event set by SIGINT or SIGTERM, which then no longer end the process."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
