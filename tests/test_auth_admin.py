"""Managing the cluster's policy: bootstrap, rotation, revocation, malformed documents,
the CLI, and the operator's token file loaded by ``raytopics serve``.

Everything runs against the real session cluster over real HTTP and real
processes; nothing is restarted between a policy change and the checks that
it applies (the gateway and the admin service re-read the stored policy).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from actors.gateway.server import start_gateway, stop_gateway
from clients import AdminHttpClient, ScalableTopicsAdmin
from runtime.auth import hash_token
from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    UnauthenticatedError,
    UnauthorizedError,
)
from tests.auth_support import client_env, policy_removed, wait_until
from tests.test_cli import RAYTOPICS, assert_one_error_line
from tests.test_gateway import free_port

OPS, APP_A, APP_B = "ops-admin-token-0123456789", "app-token-a-0123456789", "app-token-b-0123456789"
NAMESPACE = "authadm/ns"
REVOCATION_S = 10.0  # a revoked token is refused everywhere within this


def ops_entry(token: str = OPS) -> dict[str, Any]:
    return {
        "principal": "ops",
        "token": token,
        "grants": [{"namespace": "*", "actions": ["admin"]}],
    }


def app_entry(token: str) -> dict[str, Any]:
    return {
        "principal": "app",
        "sha256": hash_token(token),
        "grants": [{"namespace": NAMESPACE, "actions": ["lookup"]}],
    }


def policy(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": list(entries)}


@pytest.fixture(scope="module")
def gateway(ray_cluster) -> Iterator[str]:
    port = free_port()
    yield start_gateway(port)
    stop_gateway(port)


@pytest.fixture
def cluster_policy(ray_cluster) -> Iterator[None]:
    """Authentication is off before and after the test."""
    with policy_removed():
        yield


def rest(url: str, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def refused(call: Any) -> int | None:
    """The HTTP status of the refusal ``call()`` met, None if it was allowed."""
    try:
        call()
    except (UnauthenticatedError, UnauthorizedError) as err:
        return err.http_status
    return None


# --- bootstrap ------------------------------------------------------------------------------


def test_only_the_operator_loads_the_first_policy_and_later_ones_need_admin_everywhere(
    gateway: str, cluster_policy: None, kv_snapshot, tmp_path: Path
) -> None:
    """An open cluster refuses a first policy over REST (whoever reaches the API could
    lock everyone out with a token of their own) and takes it from inside the
    cluster's boundary: the operator's ``raytopics auth load``, a Ray driver."""
    anyone = ScalableTopicsAdmin()
    assert anyone.auth_status() == {
        "enabled": False, "version": 0, "updatedAtMs": None, "principals": []
    }  # fmt: skip
    before = kv_snapshot()
    for token in (None, OPS):
        code, reply = rest(gateway, "PUT", "/admin/v2/auth", token, policy(ops_entry()))
        assert (code, reply["error"]) == (403, "forbidden"), reply
        assert "raytopics auth load" in reply["message"] and OPS not in reply["message"]
    assert kv_snapshot() == before, "a refused first policy changed metadata"
    assert rest(gateway, "GET", "/admin/v2/auth", None)[1]["enabled"] is False
    document = tmp_path / "tokens.json"
    document.write_text(json.dumps(policy(ops_entry(), app_entry(APP_A))))
    assert "loaded" in _run(client_env(), "auth", "load", str(document))
    status = ScalableTopicsAdmin(token=OPS).auth_status()
    assert status["enabled"] and status["version"] >= 1
    assert {p["principal"] for p in status["principals"]} == {"ops", "app"}

    before = kv_snapshot()
    with pytest.raises(UnauthenticatedError):
        ScalableTopicsAdmin()  # no token: refused as soon as the client starts
    app = ScalableTopicsAdmin(token=APP_A)
    assert refused(lambda: app.load_auth(policy(ops_entry(APP_A)))) == 403
    assert refused(app.disable_auth) == 403
    assert refused(app.auth_status) == 403
    for token, want in ((None, 401), ("not-a-known-token-0000", 401), (APP_A, 403)):
        status_code, reply = rest(gateway, "PUT", "/admin/v2/auth", token, policy(ops_entry(APP_A)))
        assert (status_code, set(reply)) == (want, {"error", "message"})
        assert rest(gateway, "DELETE", "/admin/v2/auth", token)[0] == want
        assert rest(gateway, "GET", "/admin/v2/auth", token)[0] == want
    assert kv_snapshot() == before, "a refused policy change changed metadata"

    ops = ScalableTopicsAdmin(token=OPS)
    assert ops.auth_status()["version"] == status["version"]
    assert ops.load_auth(policy(ops_entry(), app_entry(APP_B)))["version"] == status["version"] + 1
    # once a policy is stored, an admin on '*' may replace it over REST
    code, replaced = rest(
        gateway, "PUT", "/admin/v2/auth", OPS, policy(ops_entry(), app_entry(APP_A))
    )
    assert code == 200 and replaced["version"] == status["version"] + 2, replaced


def test_the_status_never_shows_a_token_or_its_digest(gateway: str, cluster_policy: None) -> None:
    ScalableTopicsAdmin().load_auth(policy(ops_entry(), app_entry(APP_A)))
    with AdminHttpClient(gateway, token=OPS) as client:
        over_rest = client.auth_status()
    over_ray = ScalableTopicsAdmin(token=OPS).auth_status()
    assert over_rest == over_ray
    shown = json.dumps(over_ray)
    for secret in (OPS, APP_A, hash_token(OPS), hash_token(APP_A)):
        assert secret not in shown
    prefixes = {p["principal"]: p["sha256Prefix"] for p in over_ray["principals"]}
    assert prefixes == {"ops": hash_token(OPS)[:8], "app": hash_token(APP_A)[:8]}
    grants = {p["principal"]: p["grants"] for p in over_ray["principals"]}
    assert grants["app"] == [{"namespace": NAMESPACE, "actions": ["lookup"]}]


# --- rotation and revocation ---------------------------------------------------------------


def test_a_revoked_token_is_refused_within_seconds_without_a_restart(
    gateway: str, cluster_policy: None
) -> None:
    name, namespace = f"gateway:{gateway.rsplit(':', 1)[1]}", ray.get_runtime_context().namespace
    gateway_actor = ray.get_actor(name, namespace=namespace)
    ops = ScalableTopicsAdmin()
    ops.load_auth(policy(ops_entry(), app_entry(APP_A)))
    ops = ScalableTopicsAdmin(token=OPS)
    app = ScalableTopicsAdmin(token=APP_A)
    path = f"/admin/v2/scalable/{NAMESPACE}"
    wait_until(lambda: rest(gateway, "GET", path, APP_A)[0] == 200, REVOCATION_S)
    assert app.list_scalable_topics(NAMESPACE) == []

    ops.load_auth(policy(ops_entry()))  # app's token left out: revoked
    took = wait_until(
        lambda: (
            rest(gateway, "GET", path, APP_A)[0] == 401
            and refused(lambda: app.list_scalable_topics(NAMESPACE)) == 401
        ),
        REVOCATION_S,
    )
    assert took < REVOCATION_S
    with pytest.raises(UnauthenticatedError):
        ScalableTopicsAdmin(token=APP_A)
    assert ray.get_actor(name, namespace=namespace)._actor_id == gateway_actor._actor_id


def test_a_rotated_token_replaces_the_old_one_within_seconds(
    gateway: str, cluster_policy: None
) -> None:
    ScalableTopicsAdmin().load_auth(policy(ops_entry(), app_entry(APP_A)))
    ops = ScalableTopicsAdmin(token=OPS)
    old = ScalableTopicsAdmin(token=APP_A)
    path = f"/admin/v2/scalable/{NAMESPACE}"

    ops.load_auth(policy(ops_entry(), app_entry(APP_A), app_entry(APP_B)))  # both, for a while
    new = ScalableTopicsAdmin(token=APP_B)  # the service applies what it stored at once
    wait_until(lambda: rest(gateway, "GET", path, APP_B)[0] == 200, REVOCATION_S)
    assert old.list_scalable_topics(NAMESPACE) == new.list_scalable_topics(NAMESPACE)

    ops.load_auth(policy(ops_entry(), app_entry(APP_B)))  # the old one retired
    wait_until(
        lambda: (
            rest(gateway, "GET", path, APP_A)[0] == 401
            and refused(lambda: old.list_scalable_topics(NAMESPACE)) == 401
        ),
        REVOCATION_S,
    )
    assert rest(gateway, "GET", path, APP_B)[0] == 200
    assert new.list_scalable_topics(NAMESPACE) == []
    assert refused(lambda: new.get_namespace_limits("other/ns")) == 403

    ops.load_auth(policy(ops_entry("ops-rotated-token-0123456789")))  # the operator's own
    wait_until(lambda: rest(gateway, "GET", "/admin/v2/auth", OPS)[0] == 401, REVOCATION_S)
    assert refused(ops.auth_status) == 401
    assert ScalableTopicsAdmin(token="ops-rotated-token-0123456789").auth_status()["enabled"]


# --- malformed documents ----------------------------------------------------------------------

GRANT = [{"namespace": "*", "actions": ["admin"]}]
MALFORMED: list[tuple[str, Any]] = [
    ("not-an-object", [ops_entry()]),
    ("empty-object", {}),
    ("no-tokens-key", {"token": [ops_entry()]}),
    ("tokens-empty", {"tokens": []}),
    ("tokens-null", {"tokens": None}),
    ("tokens-not-a-list", {"tokens": "ops"}),
    ("unknown-top-key", {"tokens": [ops_entry()], "enabled": False}),
    ("entry-unknown-key", {"tokens": [{**ops_entry(), "grant": GRANT}]}),
    ("entry-no-principal", {"tokens": [{"token": OPS, "grants": GRANT}]}),
    ("token-too-short", {"tokens": [{**ops_entry(), "token": "short"}]}),
    ("token-and-digest", {"tokens": [{**ops_entry(), "sha256": hash_token(OPS)}]}),
    ("neither-token-nor-digest", {"tokens": [{"principal": "ops", "grants": GRANT}]}),
    ("digest-not-hex", {"tokens": [{"principal": "ops", "sha256": "z" * 64, "grants": GRANT}]}),
    ("grants-empty", {"tokens": [{**ops_entry(), "grants": []}]}),
    ("scope-malformed", {"tokens": [{**ops_entry(), "grants": [{"namespace": "acme",
                                                                  "actions": ["admin"]}]}]}),
    ("action-unknown", {"tokens": [{**ops_entry(), "grants": [{"namespace": "*",
                                                                 "actions": ["write"]}]}]}),
    ("one-bad-among-good", {"tokens": [ops_entry(), app_entry(APP_A), {"principal": "x"}]}),
]  # fmt: skip
# Each entry well-formed, the whole contradicting itself: no schema can say so (409).
INCONSISTENT = [
    ("same-token-twice", {"tokens": [ops_entry(), {**ops_entry(), "principal": "twin"}]}),
    ("nobody-administers-it", {"tokens": [app_entry(APP_A)]}),
]


def _refusal(name: str) -> tuple[type[Exception], int, str]:
    if name in dict(INCONSISTENT):
        return InconsistentRequestError, 409, "inconsistent"
    return InvalidArgumentError, 400, "invalid_argument"


def test_a_malformed_document_is_refused_whole_and_changes_nothing(
    gateway: str, cluster_policy: None, kv_snapshot
) -> None:
    anyone = ScalableTopicsAdmin()
    before = kv_snapshot()
    for name, document in MALFORMED + INCONSISTENT:  # while authentication is off: it stays off
        error, http_status, code = _refusal(name)
        with pytest.raises(error):
            anyone.load_auth(document)
        # over REST an open cluster takes no first policy at all: the gateway refuses
        # what its document schema does, the admin service anything else
        status, reply = rest(gateway, "PUT", "/admin/v2/auth", None, document)
        refusals = {(http_status, code), (403, "forbidden")}
        assert (status, reply["error"]) in refusals, (name, reply)
    assert kv_snapshot() == before
    assert not anyone.auth_status()["enabled"]

    anyone.load_auth(policy(ops_entry(), app_entry(APP_A)))
    ops = ScalableTopicsAdmin(token=OPS)
    version = ops.auth_status()["version"]
    before = kv_snapshot()
    for name, document in MALFORMED + INCONSISTENT:
        error, http_status, code = _refusal(name)
        with pytest.raises(error) as caught:
            ops.load_auth(document)
        assert OPS not in caught.value.message, name
        status, reply = rest(gateway, "PUT", "/admin/v2/auth", OPS, document)
        assert (status, reply["error"]) == (http_status, code), (name, reply)
        assert OPS not in reply["message"], name
    assert kv_snapshot() == before, "a refused document changed metadata"
    assert ops.auth_status()["version"] == version
    assert ScalableTopicsAdmin(token=APP_A).list_scalable_topics(NAMESPACE) == []


def test_only_disable_turns_authentication_off(gateway: str, cluster_policy: None) -> None:
    ScalableTopicsAdmin().load_auth(policy(ops_entry()))
    with AdminHttpClient(gateway, token=OPS) as ops:
        assert ops.disable_auth() == {
            "enabled": False, "version": 0, "updatedAtMs": None, "principals": []
        }  # fmt: skip
    anyone = ScalableTopicsAdmin()
    wait_until(lambda: rest(gateway, "GET", "/admin/v2/auth", None)[0] == 200, REVOCATION_S)
    assert not anyone.auth_status()["enabled"]
    assert anyone.disable_auth()["enabled"] is False  # off already: nothing to do


# --- the CLI and the operator's token file ----------------------------------------------------


def _run(env: dict[str, str], *args: str, code: int = 0) -> str:
    proc = subprocess.run(
        [RAYTOPICS, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == code, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for secret in (OPS, APP_A, APP_B):
        assert secret not in proc.stdout + proc.stderr
    return proc.stdout if code == 0 else proc.stderr


def test_cli_loads_shows_and_disables_the_policy(cluster_policy: None, tmp_path: Path) -> None:
    document = tmp_path / "tokens.json"
    document.write_text(json.dumps(policy(ops_entry(), app_entry(APP_A))))
    env = client_env()
    assert "loaded" in _run(env, "auth", "load", str(document))  # off: no token needed
    refusal = _run(env, "auth", "show", code=1)
    assert_one_error_line(refusal, "authentication required")
    app_refusal = _run(client_env(RAYTOPICS_TOKEN=APP_A), "auth", "disable", code=1)
    assert_one_error_line(app_refusal, "may not admin")

    ops_env = client_env(RAYTOPICS_TOKEN=OPS)
    shown = _run(ops_env, "auth", "show")
    assert "authentication is on" in shown and f"sha256:{hash_token(APP_A)[:8]}" in shown
    assert json.loads(_run(ops_env, "auth", "show", "--json"))["enabled"] is True
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": []}')
    assert_one_error_line(_run(ops_env, "auth", "load", str(bad), code=1), "non-empty list")
    assert_one_error_line(_run(ops_env, "auth", "load", str(tmp_path / "none"), code=1), "none")
    assert "off" in _run(ops_env, "auth", "disable")
    assert "authentication is off" in _run(client_env(), "auth", "show")


def test_a_consume_only_token_consumes_at_the_console_and_leaves_no_subscription(
    cluster_policy: None, tmp_path: Path
) -> None:
    """``raytopics consume`` without ``--subscription`` makes a temporary subscription; a
    token that may consume but not administer deletes it at the end all the same (its
    principal made it), while it may not delete a subscription someone else made."""
    reader = "reader-token-0123456789"
    entry = {"principal": "reader", "token": reader,
             "grants": [{"namespace": NAMESPACE, "actions": ["produce", "consume"]}]}  # fmt: skip
    document = tmp_path / "tokens.json"
    document.write_text(json.dumps(policy(ops_entry(), entry)))
    _run(client_env(), "auth", "load", str(document))
    topic = f"topic://{NAMESPACE}/console-{tmp_path.name[-8:]}"
    ops = ScalableTopicsAdmin(token=OPS)
    ops.create_scalable_topic(topic, 2)
    ops.create_subscription(topic, "theirs")
    env = client_env(RAYTOPICS_TOKEN=reader)
    lines = "".join(f"line {i}\n" for i in range(50))
    produced = subprocess.run(
        [RAYTOPICS, "produce", topic, "--key", "k"], input=lines, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    printed = _run(env, "consume", topic, "--from", "earliest", "--max", "50", "--timeout", "30")
    assert printed.splitlines() == [f"line {i}" for i in range(50)]
    assert ops.list_subscriptions(topic) == ["theirs"]  # the temporary one is gone
    with pytest.raises(UnauthorizedError, match="only the subscriptions it created"):
        ScalableTopicsAdmin(token=reader).delete_subscription(topic, "theirs")
    ops.delete_scalable_topic(topic)


def test_the_cli_takes_a_token_from_an_option_or_a_file(
    cluster_policy: None, gateway: str, tmp_path: Path
) -> None:
    """``--token`` and ``--token-file`` work like ``RAYTOPICS_TOKEN``, over Ray and REST;
    a refusal says every way to present a token."""
    document = tmp_path / "tokens.json"
    document.write_text(json.dumps(policy(ops_entry(), app_entry(APP_A))))
    env = client_env()
    _run(env, "auth", "load", str(document))
    token_file = tmp_path / "token"
    token_file.write_text(OPS + "\n# its first line is the token; the rest is not read\n")
    for where in ([], ["--url", gateway]):
        assert "authentication is on" in _run(env, *where, "--token", OPS, "auth", "show")
        shown = _run(env, *where, "--token-file", str(token_file), "auth", "show")
        assert "authentication is on" in shown
        refusal = _run(env, *where, "auth", "show", code=1)
        for way in ("--token-file", "--token", "RAYTOPICS_TOKEN"):
            assert way in refusal, refusal
    missing = _run(env, "--token-file", str(tmp_path / "absent"), "auth", "show", code=1)
    assert_one_error_line(missing, "cannot read --token-file")
    _run(env, "--token", OPS, "auth", "disable")


def _serve(env: dict[str, str], port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [RAYTOPICS, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(serve: subprocess.Popen) -> None:
    serve.send_signal(signal.SIGTERM)
    out, err = serve.communicate(timeout=60)
    assert serve.returncode == 0 and "stopped" in out, err


def test_serve_loads_the_operators_token_file(cluster_policy: None, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(policy(ops_entry(), app_entry(APP_A))))
    port = free_port()
    serve = _serve(client_env(RAYTOPICS_AUTH_TOKENS_FILE=str(tokens)), port)  # bootstrap
    try:
        assert "serving the admin API" in serve.stdout.readline(), serve.stderr.read()
        url = f"http://127.0.0.1:{port}"
        assert rest(url, "GET", f"/admin/v2/scalable/{NAMESPACE}", APP_A)[0] == 200
        assert rest(url, "GET", f"/admin/v2/scalable/{NAMESPACE}", None)[0] == 401
    finally:
        _stop(serve)
    ops = ScalableTopicsAdmin(token=OPS)
    version = ops.auth_status()["version"]

    # The same file again, by the operator: nothing stored anew.
    serve = _serve(client_env(RAYTOPICS_AUTH_TOKENS_FILE=str(tokens), RAYTOPICS_TOKEN=OPS), port)
    try:
        assert "serving the admin API" in serve.stdout.readline(), serve.stderr.read()
    finally:
        _stop(serve)
    assert ops.auth_status()["version"] == version

    # Another file, by someone who may not change the policy: refused, nothing started.
    takeover = tmp_path / "takeover.json"
    takeover.write_text(json.dumps(policy(ops_entry(APP_B))))
    for token in (APP_A, None):
        extra = {"RAYTOPICS_TOKEN": token} if token else {}
        env = client_env(RAYTOPICS_AUTH_TOKENS_FILE=str(takeover), **extra)
        refusal = _run(env, "serve", "--port", str(port), code=1)  # serve says which Ray, too
        errors = [line for line in refusal.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "was not loaded" in errors[0], refusal
        assert errors[0].startswith(f"error: RAYTOPICS_AUTH_TOKENS_FILE={takeover}"), refusal
        assert ops.auth_status()["version"] == version
        with pytest.raises(ValueError):
            ray.get_actor(f"gateway:{port}", namespace=ray.get_runtime_context().namespace)


def test_start_gateway_loads_the_token_file(
    cluster_policy: None, tmp_path: Path, monkeypatch
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(policy(ops_entry())))
    monkeypatch.setenv("RAYTOPICS_AUTH_TOKENS_FILE", str(tokens))
    port = free_port()
    try:
        start_gateway(port)
        assert rest(f"http://127.0.0.1:{port}", "GET", "/admin/v2/auth", OPS)[0] == 200
    finally:
        stop_gateway(port)
    status = ScalableTopicsAdmin(token=OPS).auth_status()
    assert [p["principal"] for p in status["principals"]] == ["ops"]
