"""``raytopics``: administer scalable topics from a shell.

Every command is written once against the admin API and runs either as a Ray
driver (``--address``) through ``ScalableTopicsAdmin`` or over REST (``--url``)
through ``AdminHttpClient``: the two have the same methods and raise the same
typed errors. Expected failures print a single ``error:`` line and exit 1;
usage errors exit 2 (argparse); only bugs show a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from runtime.errors import InvalidArgumentError, ScalableTopicsError, UnavailableError
from runtime.readiness import DEFAULT_READY_TIMEOUT_S
from runtime.subscription import DEFAULT_GRACE_S, ResetTo

EXAMPLES = """\
TOPIC is tenant/namespace/topic, with or without the topic:// prefix.
Global options go before the command.

examples:
  raytopics serve --port 8080                  # REST admin API (and /openapi.json)
  raytopics create public/default/orders --segments 4 --wait   # until every segment runs
  raytopics status public/default/orders       # ready, or which segments still start
  raytopics list public/default
  raytopics describe public/default/orders     # the segment DAG as a tree
  raytopics split public/default/orders 0
  raytopics merge public/default/orders 4 5
  raytopics stats public/default/orders --json
  raytopics subscriptions create public/default/orders billing --position latest
  raytopics subscriptions reset public/default/orders billing 2026-11-26T10:00:00+00:00
  raytopics limits public/default --set max_message_bytes=1048576
  raytopics --url http://127.0.0.1:8080 describe public/default/orders
  raytopics policy set public/default/orders \
    '{"autoscale": {"targetMsgsPerS": 5000, "minSegments": 2, "maxSegments": 16}}'
  raytopics policy show public/default/orders
  raytopics policy set-default public/default '{"tiering": {"uri": "s3://bucket/t"}}'
  raytopics delete public/default/orders
  seq 100 | raytopics produce public/default/orders --key k   # lines from stdin
  raytopics consume public/default/orders --from earliest --max 100 --json
  raytopics top public/default                 # live: rates, backlog, segments
  raytopics storage check                      # storage no metadata names (--delete removes it)
  raytopics recover public/default/orders      # rebuild lost metadata from storage
  raytopics auth load tokens.json              # the cluster's authentication policy
  raytopics auth show
  raytopics --url https://127.0.0.1:8443 --ca ca.pem list public/default

With authentication on, present a token: $RAYTOPICS_TOKEN, --token-file FILE, or
--token TOKEN (other users of this machine can read a command line with ps).
"""

Command = Callable[[Any, argparse.Namespace], str]


# --- commands (each returns what to print) --------------------------------------------


def _create(admin: Any, args: argparse.Namespace) -> str:
    meta = admin.create_scalable_topic(args.topic, args.segments, dict(args.property) or None)
    created = f"created {args.topic} with {args.segments} segments\n{_tree(meta)}"
    if args.wait is None:
        return (
            f"{created}\nits segments start in the background "
            f"(raytopics status {args.topic} --wait SECONDS waits for them)"
        )
    return f"{created}\n{_readiness(admin.wait_until_ready(args.topic, args.wait))}"


def _status(admin: Any, args: argparse.Namespace) -> str:
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


def _list(admin: Any, args: argparse.Namespace) -> str:
    topics = admin.list_scalable_topics(args.namespace_path)
    return "\n".join(topics) if topics else f"no topics in {args.namespace_path}"


def _describe(admin: Any, args: argparse.Namespace) -> str:
    meta = admin.get_metadata(args.topic)
    if args.json:
        return json.dumps(meta, indent=2)
    properties = ", ".join(f"{k}={v}" for k, v in sorted(meta.get("properties", {}).items()))
    return f"{args.topic}\n{_tree(meta)}" + (f"\nproperties: {properties}" if properties else "")


def _split(admin: Any, args: argparse.Namespace) -> str:
    op = admin.split_segment(args.topic, args.segment_id)
    children = " and ".join(f"#{c}" for c in op["children"])
    return f"split #{args.segment_id} of {args.topic} into {children} (epoch {op['epoch']})"


def _merge(admin: Any, args: argparse.Namespace) -> str:
    op = admin.merge_segments(args.topic, args.segment_id1, args.segment_id2)
    return (
        f"merged #{args.segment_id1} and #{args.segment_id2} of {args.topic} "
        f"into #{op['children'][0]} (epoch {op['epoch']})"
    )


def _stats(admin: Any, args: argparse.Namespace) -> str:
    stats = admin.get_stats(args.topic)
    return json.dumps(stats, indent=2) if args.json else format_stats(stats)


def _delete(admin: Any, args: argparse.Namespace) -> str:
    admin.delete_scalable_topic(args.topic)
    return f"deleted {args.topic}"


def _subscription_create(admin: Any, args: argparse.Namespace) -> str:
    admin.create_subscription(args.topic, args.subscription, args.position, args.session_grace_s)
    return f"created subscription {args.subscription} on {args.topic} at {args.position}"


def _subscription_delete(admin: Any, args: argparse.Namespace) -> str:
    admin.delete_subscription(args.topic, args.subscription)
    return f"deleted subscription {args.subscription} of {args.topic}"


def _reset_to(value: str) -> ResetTo:
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


def _subscription_reset(admin: Any, args: argparse.Namespace) -> str:
    done = admin.reset_subscription(args.topic, args.subscription, args.to)
    finished = len(done["finishedSegments"])
    future = (
        " (a time still to come: every cursor at its segment's end)" if done["inTheFuture"] else ""
    )
    return (
        f"reset subscription {args.subscription} of {args.topic} to {args.to}: "
        f"{len(done['positions'])} segments, {finished} finished{future}"
    )


def _subscription_clear(admin: Any, args: argparse.Namespace) -> str:
    admin.clear_backlog(args.topic, args.subscription)
    return f"cleared the backlog of subscription {args.subscription} of {args.topic}"


def _subscription_list(admin: Any, args: argparse.Namespace) -> str:
    return "\n".join(admin.list_subscriptions(args.topic))


def _limits(admin: Any, args: argparse.Namespace) -> str:
    """Show a namespace's limits; with ``--set`` override some first (validated whole)."""
    if args.set:
        limits = admin.set_namespace_limits(args.namespace_path, **dict(args.set))
    else:
        limits = admin.get_namespace_limits(args.namespace_path)
    width = max(map(len, limits))
    return "\n".join(f"{name:<{width}}  {value}" for name, value in limits.items())


def _policy_show(admin: Any, args: argparse.Namespace) -> str:
    return json.dumps(admin.get_policy(args.topic), indent=2)


def _policy_set(admin: Any, args: argparse.Namespace) -> str:
    stored = admin.set_policy(args.topic, args.policy)
    return f"policy of {args.topic} is now\n{json.dumps(stored, indent=2)}"


def _policy_show_default(admin: Any, args: argparse.Namespace) -> str:
    return json.dumps(admin.get_namespace_policy(args.namespace_path), indent=2)


def _policy_set_default(admin: Any, args: argparse.Namespace) -> str:
    stored = admin.set_namespace_policy(args.namespace_path, args.policy)
    return f"default policy of {args.namespace_path} is now\n{json.dumps(stored, indent=2)}"


def _storage_check(admin: Any, args: argparse.Namespace) -> str:
    report = admin.check_storage(delete=args.delete)
    return json.dumps(report, indent=2) if args.json else format_storage(report)


def _recover(admin: Any, args: argparse.Namespace) -> str:
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


def _auth_load(admin: Any, args: argparse.Namespace) -> str:
    status = admin.load_auth(_read_json(args.file))
    return f"loaded {args.file}\n{format_auth(status)}"


def _auth_show(admin: Any, args: argparse.Namespace) -> str:
    status = admin.auth_status()
    return json.dumps(status, indent=2) if args.json else format_auth(status)


def _auth_disable(admin: Any, args: argparse.Namespace) -> str:
    admin.disable_auth()
    return "authentication is off: anyone who reaches the cluster may do anything"


def _produce(admin: Any, args: argparse.Namespace) -> str:
    from clients import console

    key = console.key_of(args.key, args.key_field)
    sent = console.produce(
        args.topic, sys.stdin.buffer, key=key, rate=args.rate, token=_token(args)
    )
    print(f"produced {sent} messages to {args.topic}", file=sys.stderr)
    return ""


def _consume(admin: Any, args: argparse.Namespace) -> str:
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
    count = console.consume(admin, run, sys.stdout, sys.stderr)
    print(f"consumed {count} messages from {args.topic}", file=sys.stderr)
    return ""


def _top(admin: Any, args: argparse.Namespace) -> str:
    from clients import console

    rounds = 1 if args.once else None
    console.top(admin, args.namespaces, interval_s=args.interval, rounds=rounds, out=sys.stdout)
    return ""


def _read_json(path: str) -> Any:
    from runtime.errors import InvalidArgumentError

    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError) as err:
        raise InvalidArgumentError(f"cannot read {path}: {err}") from None


def _serve(args: argparse.Namespace) -> str:
    """Run the gateway until Ctrl-C/SIGTERM; the gateway lives exactly as long as this."""
    from actors.gateway import gateway_id, start_gateway, stop_gateway

    _connect(args)
    stop = _stop_signal()  # before the banner: whoever reads it may signal at once
    url = start_gateway(args.port, args.host, existing="replace" if args.replace else "refuse")
    ours = gateway_id(args.port)
    print(
        f"serving the admin API at {url} (see {url}/openapi.json) and the web console at "
        f"{url}/; Ctrl-C stops",
        flush=True,
    )
    while not stop.wait(0.5):
        pass
    if not stop_gateway(args.port, only=ours):
        return f"stopped (the gateway on port {args.port} had been replaced; it keeps serving)"
    return "stopped"


# --- formatting -------------------------------------------------------------------------


def _tree(meta: dict[str, Any]) -> str:
    from runtime.layout import SegmentLayout
    from runtime.render import render_tree

    return render_tree(SegmentLayout.from_dict(meta))


def format_stats(stats: dict[str, Any]) -> str:
    """A topic's stats as a short report: totals, one line per segment and subscription."""
    lines = [
        f"{stats['topic']} at epoch {stats['epoch']}: {stats['activeSegments']} active / "
        f"{stats['sealedSegments']} sealed segments, {stats['records']} records, "
        f"{_size(stats['sizeBytes'])}",
        "",
        f"{'SEGMENT':<8} {'STATE':<7} {'RANGE':<10} {'RECORDS':>9} {'SIZE':>10}",
    ]
    for seg_id, seg in sorted(stats["segments"].items(), key=lambda item: int(item[0])):
        rng = f"{seg['hashRange']['start']:04x}-{seg['hashRange']['end']:04x}"
        lines.append(
            f"{'#' + seg_id:<8} {seg['state']:<7} {rng:<10} {seg['records']:>9} "
            f"{_size(seg['sizeBytes']):>10}"
        )
    lines.append("")
    if not stats["subscriptions"]:
        return "\n".join([*lines, "no subscriptions"])
    lines.append(f"{'SUBSCRIPTION':<24} {'STATE':<9} {'CONSUMERS':>9} {'BACKLOG':>9}")
    for name, sub in sorted(stats["subscriptions"].items()):
        lines.append(f"{name:<24} {sub['state']:<9} {sub['consumers']:>9} {sub['backlog']:>9}")
    return "\n".join(lines)


def format_storage(report: dict[str, Any]) -> str:
    """The storage check as a table of orphaned (and foreign) incarnations."""
    from storage.topic_storage import written_at

    lines = [f"storage root {report['storageRoot']}: {report['live']} live incarnations"]
    for title, rows in (("orphaned", report["orphaned"]), ("foreign", report["foreign"])):
        if not rows:
            continue
        lines += ["", f"{title} ({len(rows)}):"]
        lines.append(f"{'TOPIC':<40} {'INCARNATION':<26} {'SEGMENTS':>8} {'SIZE':>10}  LAST WRITE")
        for row in rows:
            lines.append(
                f"{row['topic']:<40} {row['incarnation'] or '(none)':<26} {row['segments']:>8} "
                f"{_size(row['sizeBytes']):>10}  {written_at(row['lastWriteMs'])}"
            )
            if "reason" in row:
                lines.append(f"  {row['reason']}")
    if report["deleted"]:
        lines += ["", f"deleted {len(report['deleted'])} orphaned incarnations"]
    elif report["orphaned"]:
        lines += [
            "",
            "raytopics storage check --delete removes them; raytopics recover TOPIC "
            "brings back one whose metadata was lost",
        ]
    else:
        lines.append("no orphaned storage")
    return "\n".join(lines)


def format_auth(status: dict[str, Any]) -> str:
    """The cluster's policy: one line per token, by principal and 8 hex digits of its
    SHA-256, with its grants."""
    if not status["enabled"]:
        return "authentication is off (no policy stored): anyone may do anything"
    lines = [f"authentication is on: policy version {status['version']}"]
    width = max(len(p["principal"]) for p in status["principals"])
    for entry in status["principals"]:
        grants = "; ".join(f"{g['namespace']}: {','.join(g['actions'])}" for g in entry["grants"])
        lines.append(f"  {entry['principal']:<{width}}  sha256:{entry['sha256Prefix']}  {grants}")
    return "\n".join(lines)


def _size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    scaled, unit = float(num_bytes), "B"
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the last unit is the answer
        scaled /= 1024
        if scaled < 1024:
            break
    return f"{scaled:.1f} {unit}"


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


def _open_admin(args: argparse.Namespace) -> Any:
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


# --- argument parsing -------------------------------------------------------------------


def _topic(text: str) -> str:
    """``t/n/x`` or ``topic://t/n/x``; the admin validates the parts."""
    return text if text.startswith("topic://") else f"topic://{text}"


def _url(text: str) -> str:
    """``http://`` or ``https://`` with a host: ``127.0.0.1:8080`` alone is refused by
    argparse with what to write instead, not sent as a garbled request."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https") or not rest.strip("/"):
        raise argparse.ArgumentTypeError(
            f"expected http://HOST:PORT or https://HOST:PORT, got {text!r}"
            + (f" (did you mean http://{text}?)" if not sep else "")
        )
    return text


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds ≥ 0, got {text!r}")
    return value


def _limit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=INTEGER, got {text!r}")
    return name, int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytopics",
        description="Administer scalable topics (segment DAGs that split and merge) on Ray.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS") or None,
        help="Ray cluster address, or 'auto' for the one running here (default: "
        "$RAY_ADDRESS, else a cluster started on this machine with `ray start`, else "
        "the embedded Ray of the storage root, started if need be)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("RAYTOPICS_NAMESPACE"),
        help="Ray namespace of the system (default: $RAYTOPICS_NAMESPACE or 'scalable-topics')",
    )
    parser.add_argument(
        "--url",
        type=_url,
        help="talk to a running admin gateway over REST instead of Ray (http[s]://host:port)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help="the token to present when authentication is on (default: $RAYTOPICS_TOKEN; "
        "other users can read a command line with ps: prefer --token-file or the variable)",
    )
    token.add_argument(
        "--token-file", metavar="FILE", help="read the token from FILE (its first line)"
    )
    parser.add_argument(
        "--ca",
        default=None,
        metavar="FILE",
        help="CA certificate an https:// gateway must be signed by (default: $RAYTOPICS_TLS_CA)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(commands, "serve", None, "run the REST admin gateway until Ctrl-C")
    serve.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument(
        "--replace",
        action="store_true",
        help="stop a gateway already serving --port and serve in its place (default: refuse)",
    )

    create = _command(commands, "create", _create, "create a topic", topic=True)
    create.add_argument("--segments", type=int, required=True, help="initial segments, 1-65536")
    create.add_argument(
        "--property", type=_property, action="append", default=[], metavar="KEY=VALUE",
        help="a property stored with the topic (repeatable)",
    )  # fmt: skip
    _wait_option(create, "after creating, wait up to SECONDS (default 120) for every segment")
    status = _command(
        commands, "status", _status, "whether every segment of a topic runs", topic=True
    )
    _wait_option(status, "wait up to SECONDS (default 120) for every segment to run")
    status.add_argument("--json", action="store_true", help="print the status JSON")
    listing = _command(commands, "list", _list, "list the topics of a namespace")
    listing.add_argument("namespace_path", metavar="TENANT/NS")
    describe = _command(commands, "describe", _describe, "show the segment DAG", topic=True)
    describe.add_argument("--json", action="store_true", help="print the metadata JSON")
    split = _command(commands, "split", _split, "split an active segment", topic=True)
    split.add_argument("segment_id", type=int, metavar="ID", help="the active segment's id")
    merge = _command(commands, "merge", _merge, "merge two adjacent segments", topic=True)
    merge.add_argument("segment_id1", type=int, metavar="ID1", help="an active segment's id")
    merge.add_argument("segment_id2", type=int, metavar="ID2", help="its adjacent neighbour's id")
    stats = _command(commands, "stats", _stats, "segment and subscription stats", topic=True)
    stats.add_argument("--json", action="store_true", help="print the raw stats JSON")
    _command(commands, "delete", _delete, "delete a topic and its segments", topic=True)
    _console_commands(commands)
    limits = _command(commands, "limits", _limits, "show (or --set) a namespace's limits")
    limits.add_argument("namespace_path", metavar="TENANT/NS")
    limits.add_argument(
        "--set",
        type=_limit,
        action="append",
        default=[],
        metavar="NAME=INTEGER",
        help="override a limit, e.g. max_message_bytes=1048576 (repeatable)",
    )

    subs = commands.add_parser("subscriptions", help="create, delete or list subscriptions")
    sub_commands = subs.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    sub_create = _command(
        sub_commands, "create", _subscription_create, "create a subscription", topic=True
    )
    sub_create.add_argument("subscription", metavar="SUB")
    sub_create.add_argument("--position", choices=("earliest", "latest"), default="earliest")
    sub_create.add_argument(
        "--session-grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help=f"how long a disconnected stream consumer keeps its segments ({DEFAULT_GRACE_S:g})",
    )
    sub_delete = _command(
        sub_commands, "delete", _subscription_delete, "delete a subscription", topic=True
    )
    sub_delete.add_argument("subscription", metavar="SUB")
    _command(sub_commands, "list", _subscription_list, "list subscriptions", topic=True)
    sub_reset = _command(
        sub_commands,
        "reset",
        _subscription_reset,
        "move a subscription to earliest, latest or a publish time",
        topic=True,
    )
    sub_reset.add_argument("subscription", metavar="SUB")
    sub_reset.add_argument(
        "to",
        type=_reset_to,
        metavar="WHEN",
        help="earliest, latest, epoch milliseconds or an ISO 8601 time with a zone",
    )
    sub_clear = _command(
        sub_commands,
        "clear-backlog",
        _subscription_clear,
        "acknowledge everything a subscription has not yet",
        topic=True,
    )
    sub_clear.add_argument("subscription", metavar="SUB")

    storage = commands.add_parser("storage", help="check the storage root for orphaned storage")
    storage_commands = storage.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    check = _command(
        storage_commands, "check", _storage_check, "list storage that no live metadata names"
    )
    check.add_argument("--delete", action="store_true", help="remove the orphaned storage")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    recover = _command(
        commands, "recover", _recover, "rebuild a topic's lost metadata from storage", topic=True
    )
    recover.add_argument(
        "--incarnation", metavar="ID", help="which stored incarnation (storage check lists them)"
    )
    recover.add_argument("--json", action="store_true", help="print the result as JSON")

    auth = commands.add_parser("auth", help="the cluster's authentication policy")
    auth_commands = auth.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    auth_load = _command(
        auth_commands, "load", _auth_load, "make a token document the cluster's policy"
    )
    auth_load.add_argument("file", metavar="FILE", help="the token document (JSON)")
    auth_show = _command(auth_commands, "show", _auth_show, "principals and grants (never tokens)")
    auth_show.add_argument("--json", action="store_true", help="print the status as JSON")
    _command(auth_commands, "disable", _auth_disable, "turn authentication off")

    policy = commands.add_parser(
        "policy", help="show or set a topic's (or a namespace's default) autoscale, retention "
        "and tiering policy",
    )  # fmt: skip
    policy_commands = policy.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    _command(policy_commands, "show", _policy_show, "print the policy as JSON", topic=True)
    policy_set = _command(policy_commands, "set", _policy_set, "replace the policy", topic=True)
    policy_set.add_argument(
        "policy", type=_json_object, metavar="JSON",
        help='e.g. {"autoscale": {"targetMsgsPerS": 5000}, "retention": {"timeS": 86400}}',
    )  # fmt: skip
    show_default = _command(
        policy_commands, "show-default", _policy_show_default,
        "print a namespace's default policy (what its topics follow where theirs sets nothing)",
    )  # fmt: skip
    show_default.add_argument("namespace_path", metavar="TENANT/NS")
    set_default = _command(
        policy_commands, "set-default", _policy_set_default,
        "replace a namespace's default policy",
    )  # fmt: skip
    set_default.add_argument("namespace_path", metavar="TENANT/NS")
    set_default.add_argument(
        "policy", type=_json_object, metavar="JSON",
        help='e.g. {"tiering": {"uri": "s3://bucket/topics", "afterS": 300}}',
    )  # fmt: skip
    return parser


def _console_commands(commands: Any) -> None:
    produce = _command(
        commands, "produce", _produce, "send lines from stdin to a topic", topic=True
    )
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", help="one key for every line (default: no key)")
    keys.add_argument(
        "--key-field", metavar="FIELD", help="each line is a JSON object; its FIELD is the key"
    )
    produce.add_argument(
        "--rate", type=_positive, metavar="N",
        help="send at most N messages a second (default: no limit)",
    )  # fmt: skip
    consume = _command(
        commands, "consume", _consume, "print what a subscription receives", topic=True
    )
    consume.add_argument(
        "--subscription", metavar="S",
        help="subscription to read (created at --from if missing; default: a temporary "
        "one, deleted when done)",
    )  # fmt: skip
    consume.add_argument(
        "--from", dest="start", choices=("earliest", "latest"), default="latest",
        help="where a new subscription starts (default latest)",
    )  # fmt: skip
    consume.add_argument(
        "--max", type=lambda text: int(_positive(text)), metavar="N", help="stop after N messages"
    )
    consume.add_argument(
        "--timeout", type=_seconds, metavar="SECONDS",
        help="stop after SECONDS without a message (default: wait for more until Ctrl-C)",
    )  # fmt: skip
    consume.add_argument(
        "--json", action="store_true",
        help="one JSON object per message: key, value (valueBase64 if not UTF-8), segment, "
        "offset, publishTime, properties (default: the value alone)",
    )  # fmt: skip
    top = _command(commands, "top", _top, "a live table of topics: rates, backlog, segments")
    top.add_argument("namespaces", nargs="+", metavar="TENANT/NS", help="namespaces to show")
    top.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="SECONDS", help="refresh (default 2)"
    )
    top.add_argument("--once", action="store_true", help="print one table and exit")


def _wait_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--wait", type=_seconds, nargs="?", const=DEFAULT_READY_TIMEOUT_S, metavar="SECONDS",
        help=f"{help_text}; fails (exit 1) naming the segments still down",
    )  # fmt: skip


def _command(
    commands: Any, name: str, run: Command | None, help_text: str, *, topic: bool = False
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(run=run)
    if topic:
        parser.add_argument(
            "topic", type=_topic, metavar="TOPIC", help="tenant/namespace/topic (topic:// optional)"
        )
    return parser


# --- entry point ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["help"]:  # `raytopics help [COMMAND...]`, as git and kubectl take it
        argv = [*argv[1:], "--help"]
    args = parser.parse_args(argv)
    if args.command in ("serve", "produce", "consume") and args.url:
        parser.error(f"{args.command} runs on Ray; it cannot run through --url")
    try:
        output = _serve(args) if args.run is None else _run(args.run, args)
    except ScalableTopicsError as err:
        print(f"error: {' '.join(err.message.split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if output:
        print(output)
    return 0


def _run(command: Command, args: argparse.Namespace) -> str:
    admin = _open_admin(args)
    try:
        return command(admin, args)
    finally:
        close = getattr(admin, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    sys.exit(main())
