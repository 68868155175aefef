"""A topic's policy through every door: Python (sync and async), REST and the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_cli import cli_env, raytopics  # noqa: F401  (cli_env is a fixture)
from test_gateway import gateway, http  # noqa: F401  (gateway is a fixture)

from actors.gateway.routes import openapi_document
from clients import AdminHttpClient
from runtime.errors import InconsistentRequestError, TopicNotFoundError
from runtime.policy import TopicPolicy

POLICY = {
    "autoscale": {"targetMsgsPerS": 500, "minSegments": 2, "maxSegments": 8, "cooldownS": 30},
    "retention": {"timeS": 3600},
}


def test_python_admin_stores_validates_and_never_half_applies(admin, unique) -> None:
    topic = f"topic://policy/ns/t-{unique}"
    admin.create_scalable_topic(topic, 1)
    assert admin.get_policy(topic) == {
        "autoscale": None,
        "retention": None,
        "tiering": None,
        "hibernation": None,
        "keyShared": None,
        "replication": None,
    }
    stored = admin.set_policy(topic, POLICY)
    assert stored["autoscale"]["targetMsgsPerS"] == 500
    assert stored["autoscale"]["scaleFactor"] == 2.0  # defaults filled in
    assert asyncio.run(admin.get_policy_async(topic)) == stored
    bad = {"autoscale": {"targetMsgsPerS": 500, "minSegments": 9, "maxSegments": 8}}
    with pytest.raises(InconsistentRequestError, match="minSegments 9 > maxSegments 8"):
        admin.set_policy(topic, bad)
    assert admin.get_policy(topic) == stored
    assert admin.get_metadata(topic)["epoch"] == 0  # the layout did not move
    with pytest.raises(TopicNotFoundError):
        admin.set_policy(f"topic://policy/ns/missing-{unique}", POLICY)
    admin.delete_scalable_topic(topic)


def test_rest_and_openapi(admin, gateway, unique) -> None:  # noqa: F811
    topic = f"topic://policy/ns/r-{unique}"
    admin.create_scalable_topic(topic, 1)
    client = AdminHttpClient(gateway)
    assert client.set_policy(topic, POLICY) == admin.get_policy(topic)
    assert client.get_policy(topic)["retention"]["timeS"] == 3600
    path = f"/admin/v2/scalable/policy/ns/r-{unique}/policy"
    status, body = http(gateway, "PUT", path, {"autoscale": {"targetMsgsPerS": "fast"}})
    assert status == 400 and body["error"] == "invalid_argument", body
    status, body = http(gateway, "PUT", path, {"retention": {"timeS": 1}, "extra": 1})
    assert status == 400 and "extra" in body["message"]
    assert admin.get_policy(topic)["retention"]["timeS"] == 3600
    operations = openapi_document()["paths"][
        "/admin/v2/scalable/{tenant}/{namespace}/{topic}/policy"
    ]
    assert {operations["get"]["operationId"], operations["put"]["operationId"]} == {
        "getPolicy", "setPolicy",
    }  # fmt: skip
    client.close()
    admin.delete_scalable_topic(topic)


def test_cli(admin, cli_env, unique) -> None:  # noqa: F811
    topic = f"policy/ns/c-{unique}"
    admin.create_scalable_topic(f"topic://{topic}", 1)
    out = raytopics(cli_env, "policy", "set", topic, json.dumps(POLICY))
    assert "policy of" in out and '"targetMsgsPerS": 500.0' in out
    assert json.loads(raytopics(cli_env, "policy", "show", topic))["retention"]["timeS"] == 3600
    err = raytopics(cli_env, "policy", "set", topic, '{"retention": {"timeS": -1}}', code=1)
    assert err.startswith("error: invalid topic policy: retention.timeS")
    admin.delete_scalable_topic(f"topic://{topic}")


def test_a_namespace_default_fills_only_the_parts_a_topic_leaves_unset() -> None:
    default = TopicPolicy.parse(
        {"retention": {"timeS": 60}, "tiering": {"uri": "s3://b/ns", "afterS": 5}}
    )
    own = TopicPolicy.parse({"tiering": {"uri": "file:///t", "afterS": 1}})
    merged = own.over(default)
    assert merged.tiering == own.tiering  # a part set by the topic wins whole
    assert merged.retention == default.retention and merged.autoscale is None
    assert TopicPolicy().over(default) == default
    assert own.over(None) is own
