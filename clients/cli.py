"""``raytopics``: administer scalable topics from a shell.

Every command is written once against the Admin Client API and runs either as a Ray
driver (``--address``) through ``ScalableTopicsAdmin`` or over REST (``--url``)
through ``AdminHttpClient``: the two have the same methods and raise the same
typed errors. The commands here format for people; every API method none of them
calls is a command generated from its signature (``clients.cli_calls``). Expected
failures print a single ``error:`` line and exit 1; usage errors exit 2 (argparse);
only bugs show a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, TextIO

from clients import cli_commands as run
from clients._install import RayNotInstalledError, ray_required
from clients.cli_calls import add_generated, json_object
from clients.cli_commands import Command
from runtime.errors import ScalableTopicsError
from runtime.readiness import DEFAULT_READY_TIMEOUT_S
from runtime.subscription import DEFAULT_GRACE_S

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
  raytopics hash customer-42                   # a key's hash: where its segment's range is
  raytopics split public/default/orders 3 --at 0x8a00   # the upper child from 0x8a00
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
  raytopics position-at-time public/default/orders 2026-11-26T10:00:00+00:00
  raytopics terminate-segment segment://public/default/orders/0000-7fff-3 --force
  raytopics auth load tokens.json              # the cluster's authentication policy
  raytopics auth show
  raytopics --url https://127.0.0.1:8443 --ca ca.pem list public/default

With authentication on, present a token: $RAYTOPICS_TOKEN, --token-file FILE, or
--token TOKEN (other users of this machine can read a command line with ps).
"""


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


def _hash(text: str) -> int:
    """A key hash as the user writes it: decimal or 0x-hex, within 16 bits."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 0-65535 or 0x0000-0xffff, got {text!r}"
        ) from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"a hash is 0-65535 (0xffff), got {text!r}")
    return value


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

    create = _command(commands, "create", run.create_topic, "create a topic", topic=True)
    create.add_argument("--segments", type=int, required=True, help="initial segments, 1-65536")
    create.add_argument(
        "--property", type=_property, action="append", default=[], metavar="KEY=VALUE",
        help="a property stored with the topic (repeatable)",
    )  # fmt: skip
    _wait_option(create, "after creating, wait up to SECONDS (default 120) for every segment")
    status = _command(
        commands, "status", run.status, "whether every segment of a topic runs", topic=True
    )
    _wait_option(status, "wait up to SECONDS (default 120) for every segment to run")
    status.add_argument("--json", action="store_true", help="print the status JSON")
    listing = _command(commands, "list", run.list_topics, "list the topics of a namespace")
    listing.add_argument("namespace_path", metavar="TENANT/NS")
    describe = _command(commands, "describe", run.describe, "show the segment DAG", topic=True)
    describe.add_argument("--json", action="store_true", help="print the metadata JSON")
    split = _command(
        commands, "split", run.split,
        "split an active segment: in halves, at --at hashes, or into --parts equal ones",
        topic=True,
    )  # fmt: skip
    split.add_argument("segment_id", type=int, metavar="ID", help="the active segment's id")
    split.add_argument(
        "--at", type=_hash, action="append", default=None, metavar="HASH",
        help="where a child starts (0-65535, or 0x0000-0xffff): keys that hash below it go "
        "to the child before; repeat for more children, in ascending order; `raytopics hash "
        "KEY` prints a key's hash",
    )  # fmt: skip
    split.add_argument(
        "--parts", type=int, default=None, metavar="N",
        help="split into N near-equal children instead (2-64)",
    )  # fmt: skip
    hashing = commands.add_parser(
        "hash", help="print each KEY's hash, which routes it to a segment",
        description="print each KEY's 16-bit hash (Murmur3 of its UTF-8 bytes), which picks "
        "the active segment whose range holds it; no cluster is asked",
    )  # fmt: skip
    hashing.add_argument("keys", nargs="+", metavar="KEY")
    hashing.set_defaults(run=None, offline=run.key_hashes)
    merge = _command(
        commands, "merge", run.merge, "merge two adjacent segments, or a run of them", topic=True
    )
    merge.add_argument("segment_id1", type=int, metavar="ID1", help="an active segment's id")
    merge.add_argument("segment_id2", type=int, metavar="ID2", help="its adjacent neighbour's id")
    merge.add_argument(
        "more_segment_ids", type=int, nargs="*", metavar="ID",
        help="further neighbours merged in the same operation (up to 64 segments in all)",
    )  # fmt: skip
    stats = _command(commands, "stats", run.stats, "segment and subscription stats", topic=True)
    stats.add_argument("--json", action="store_true", help="print the raw stats JSON")
    _command(commands, "delete", run.delete_topic, "delete a topic and its segments", topic=True)
    _console_commands(commands)
    limits = _command(commands, "limits", run.limits, "show (or --set) a namespace's limits")
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
        sub_commands, "create", run.subscription_create, "create a subscription", topic=True
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
        sub_commands, "delete", run.subscription_delete, "delete a subscription", topic=True
    )
    sub_delete.add_argument("subscription", metavar="SUB")
    _command(sub_commands, "list", run.subscription_list, "list subscriptions", topic=True)
    sub_reset = _command(
        sub_commands,
        "reset",
        run.subscription_reset,
        "move a subscription to earliest, latest or a publish time",
        topic=True,
    )
    sub_reset.add_argument("subscription", metavar="SUB")
    sub_reset.add_argument(
        "to",
        type=run.reset_to,
        metavar="WHEN",
        help="earliest, latest, epoch milliseconds or an ISO 8601 time with a zone",
    )
    sub_clear = _command(
        sub_commands,
        "clear-backlog",
        run.subscription_clear,
        "acknowledge everything a subscription has not yet",
        topic=True,
    )
    sub_clear.add_argument("subscription", metavar="SUB")

    storage = commands.add_parser("storage", help="check the storage root for orphaned storage")
    storage_commands = storage.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    check = _command(
        storage_commands, "check", run.storage_check, "list storage that no live metadata names"
    )
    check.add_argument("--delete", action="store_true", help="remove the orphaned storage")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    recover = _command(
        commands, "recover", run.recover, "rebuild a topic's lost metadata from storage", topic=True
    )
    recover.add_argument(
        "--incarnation", metavar="ID", help="which stored incarnation (storage check lists them)"
    )
    recover.add_argument("--json", action="store_true", help="print the result as JSON")

    auth = commands.add_parser("auth", help="the cluster's authentication policy")
    auth_commands = auth.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    auth_load = _command(
        auth_commands, "load", run.auth_load, "make a token document the cluster's policy"
    )
    auth_load.add_argument("file", metavar="FILE", help="the token document (JSON)")
    auth_show = _command(
        auth_commands, "show", run.auth_show, "principals and grants (never tokens)"
    )
    auth_show.add_argument("--json", action="store_true", help="print the status as JSON")
    _command(auth_commands, "disable", run.auth_disable, "turn authentication off")

    policy = commands.add_parser(
        "policy", help="show or set a topic's (or a namespace's default) autoscale, retention "
        "and tiering policy",
    )  # fmt: skip
    policy_commands = policy.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    _command(policy_commands, "show", run.policy_show, "print the policy as JSON", topic=True)
    policy_set = _command(policy_commands, "set", run.policy_set, "replace the policy", topic=True)
    policy_set.add_argument(
        "policy", type=json_object, metavar="JSON",
        help='e.g. {"autoscale": {"targetMsgsPerS": 5000}, "retention": {"timeS": 86400}}',
    )  # fmt: skip
    show_default = _command(
        policy_commands, "show-default", run.policy_show_default,
        "print a namespace's default policy (what its topics follow where theirs sets nothing)",
    )  # fmt: skip
    show_default.add_argument("namespace_path", metavar="TENANT/NS")
    set_default = _command(
        policy_commands, "set-default", run.policy_set_default,
        "replace a namespace's default policy",
    )  # fmt: skip
    set_default.add_argument("namespace_path", metavar="TENANT/NS")
    set_default.add_argument(
        "policy", type=json_object, metavar="JSON",
        help='e.g. {"tiering": {"uri": "s3://bucket/topics", "afterS": 300}}',
    )  # fmt: skip
    add_generated(commands, _topic)
    return parser


def _console_commands(commands: Any) -> None:
    produce = _command(
        commands, "produce", run.produce, "send lines from stdin to a topic", topic=True
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
        commands, "consume", run.consume, "print what a subscription receives", topic=True
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
    top = _command(commands, "top", run.top, "a live table of topics: rates, backlog, segments")
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


def console_script() -> None:
    """The ``raytopics`` command. Its stdout carries the command's output alone: what
    Ray prints for a driver goes to stderr while the command runs (``main``), and so do
    the lines Ray's exit handlers print (how often a report repeated)."""
    code = main()
    sys.stdout.flush()
    sys.stdout = sys.stderr
    sys.exit(code)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Runs one command, its output on ``out`` (stdout); returns the exit code."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["help"]:  # `raytopics help [COMMAND...]`, as git and kubectl take it
        argv = [*argv[1:], "--help"]
    args = parser.parse_args(argv)
    if args.command in ("serve", "produce", "consume") and args.url:
        parser.error(f"{args.command} runs on Ray; it cannot run through --url")
    # A Ray driver prints what the cluster reports (a raylet's warning about starting
    # workers, say) on its stdout, which is this command's output: a consumer's lines or
    # a JSON answer piped to another program. The command writes to ``args.out``; for
    # as long as it runs, everything else printed on stdout goes to stderr.
    args.out = out or sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr), ray_required("raytopics without --url"):
            offline = getattr(args, "offline", None)
            if offline is not None:
                output = offline(args)
            else:
                output = run.serve(args) if args.run is None else _run(args.run, args)
    except ScalableTopicsError as err:
        print(f"error: {' '.join(err.message.split())}", file=sys.stderr)
        return 1
    except RayNotInstalledError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if output:
        print(output, file=args.out)
    return 0


def _run(command: Command, args: argparse.Namespace) -> str:
    admin = run.open_admin(args)
    try:
        return command(admin, args)
    finally:
        close = getattr(admin, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    console_script()
