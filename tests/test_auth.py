"""The pure auth policy: token digests, implied permissions, namespace scopes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.auth import AuthPolicy, Permission, bearer_token, hash_token
from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    UnauthenticatedError,
    UnauthorizedError,
)

OPS, APP, READER = "ops-token-0123456789", "app-token-0123456789", "reader-token-012345"
CONFIG = {
    "tokens": [
        {"principal": "ops", "token": OPS, "grants": [{"namespace": "*", "actions": ["admin"]}]},
        {
            "principal": "app",
            "sha256": hash_token(APP),
            "grants": [
                {"namespace": "acme/orders", "actions": ["produce"]},
                {"namespace": "acme/*", "actions": ["consume"]},
            ],
        },
        {
            "principal": "reader",
            "token": READER,
            "grants": [{"namespace": "x/y", "actions": ["lookup"]}],
        },
    ]
}
POLICY = AuthPolicy.from_config(CONFIG)
ADMIN = [{"namespace": "*", "actions": ["admin"]}]


def test_no_tokens_means_auth_off() -> None:
    assert not AuthPolicy().enabled
    assert AuthPolicy().authorize(None, Permission.ADMIN, "a/b") is None


@pytest.mark.parametrize(
    ("token", "permission", "namespace", "allowed"),
    [
        (OPS, Permission.ADMIN, "any/thing", True),
        (OPS, Permission.PRODUCE, "any/thing", True),
        (APP, Permission.PRODUCE, "acme/orders", True),
        (APP, Permission.LOOKUP, "acme/orders", True),  # implied by produce
        (APP, Permission.PRODUCE, "acme/billing", False),
        (APP, Permission.CONSUME, "acme/billing", True),  # tenant wildcard
        (APP, Permission.CONSUME, "acmex/billing", False),  # no prefix match on tenant
        (APP, Permission.ADMIN, "acme/orders", False),
        (READER, Permission.LOOKUP, "x/y", True),
        (READER, Permission.PRODUCE, "x/y", False),  # lookup implies nothing more
        (READER, Permission.LOOKUP, "x/z", False),
    ],
)
def test_grants(token: str, permission: Permission, namespace: str, allowed: bool) -> None:
    if allowed:
        assert POLICY.authorize(token, permission, namespace) is not None
    else:
        with pytest.raises(UnauthorizedError) as err:
            POLICY.authorize(token, permission, namespace)
        assert err.value.http_status == 403 and token not in str(err.value)


@pytest.mark.parametrize("token", [None, "", "wrong-token-0123456789", OPS + " "])
def test_unknown_tokens_are_unauthenticated(token: str | None) -> None:
    with pytest.raises(UnauthenticatedError) as err:
        POLICY.authorize(token, Permission.LOOKUP, "a/b")
    assert err.value.http_status == 401
    assert not token or token not in str(err.value)


def test_only_digests_are_kept_or_exported() -> None:
    exported = repr(POLICY) + repr(POLICY.to_config())
    assert OPS not in exported and READER not in exported
    assert AuthPolicy.from_config(POLICY.to_config()) == POLICY


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"tokens": {}},
        {"tokens": [{"token": OPS, "grants": ADMIN}]},  # no principal
        {"tokens": [{"principal": "p", "grants": ADMIN}]},  # neither token nor digest
        {"tokens": [{"principal": "p", "token": OPS, "sha256": hash_token(OPS), "grants": ADMIN}]},
        {"tokens": [{"principal": "p", "token": "short", "grants": ADMIN}]},
        {"tokens": [{"principal": "p", "sha256": "zz", "grants": ADMIN}]},
        {"tokens": [{"principal": "p", "token": OPS, "grants": [{"namespace": "a"}]}]},
        {"tokens": [{"principal": "p", "token": OPS, "grants": [{"namespace": "*/b"}]}]},
        {"tokens": [{"principal": "p", "token": OPS, "grants": [{"namespace": "a/b/c"}]}]},
        {"tokens": [{"principal": "p", "token": OPS, "grants": "all"}]},
        {
            "tokens": [
                {
                    "principal": "p",
                    "token": OPS,
                    "grants": [{"namespace": "*", "actions": ["root"]}],
                }
            ]
        },
        {
            "tokens": [
                {"principal": "p", "token": OPS, "grants": ADMIN},
                {"principal": "q", "token": OPS, "grants": ADMIN},
            ]
        },
    ],
)
def test_malformed_config_is_refused_whole(doc: object) -> None:
    # malformed: 400; a token listed twice, each entry well-formed: 409
    with pytest.raises((InvalidArgumentError, InconsistentRequestError)):
        AuthPolicy.from_config(doc)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"token": [{"principal": "p", "token": OPS, "grants": ADMIN}]}, "unknown key 'token'"),
        ({"tokens": []}, "non-empty list"),
        ({}, "missing 'tokens'"),
        ({"tokens": [{"principal": "p", "token": OPS, "grant": ADMIN}]}, "tokens[0]: unknown key"),
        ({"tokens": [{"principal": "p", "token": OPS, "grants": []}]}, "tokens[0]: 'grants'"),
        (
            {"tokens": [{"principal": "p", "token": OPS, "grants": [{"namespace": "*"}]}]},
            "tokens[0].grants[0]: missing 'actions'",
        ),
        (
            {
                "tokens": [
                    {
                        "principal": "p",
                        "token": OPS,
                        "grants": [{"namespace": "*", "action": ["admin"]}],
                    }
                ]
            },  # fmt: skip
            "tokens[0].grants[0]: unknown key 'action'; allowed: namespace, actions",
        ),
        (
            {
                "tokens": [
                    {"principal": "p", "token": OPS, "grants": [{"namespace": "*", "actions": []}]}
                ]
            },  # fmt: skip
            "tokens[0].grants[0]: 'actions' must be a non-empty list",
        ),
        (
            {"tokens": [{"principal": "p", "token": OPS, "grants": ADMIN, "note": "x"}]},
            "allowed: principal, token, sha256, grants",
        ),
    ],
)
def test_a_document_meant_to_turn_auth_on_never_turns_it_off(doc: object, said: str) -> None:
    """Misspellings, unknown keys and empty lists are refused, saying where and what is
    allowed; none of them reads as "no tokens" (auth off)."""
    with pytest.raises(InvalidArgumentError) as err:
        AuthPolicy.from_config(doc)  # type: ignore[arg-type]
    assert said in err.value.message
    assert OPS not in err.value.message


def test_from_env_reads_the_operators_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RAYTOPICS_AUTH_TOKENS_FILE", raising=False)
    assert not AuthPolicy.from_env().enabled
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"principal": "ops", "token": OPS, "grants": ADMIN}]}))
    monkeypatch.setenv("RAYTOPICS_AUTH_TOKENS_FILE", str(path))
    assert AuthPolicy.from_env().authenticate(OPS).name == "ops"
    path.write_text("{not json")
    with pytest.raises(InvalidArgumentError):
        AuthPolicy.from_env()


@pytest.mark.parametrize(
    ("header", "token"),
    [(None, None), ("", None), ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None)],
)
def test_bearer_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@given(st.text(max_size=40))
def test_any_other_token_is_refused(token: str) -> None:
    if token in (OPS, APP, READER):
        return
    with pytest.raises(UnauthenticatedError):
        POLICY.authenticate(token)


def test_hash_token_refuses_what_a_plain_token_entry_refuses() -> None:
    with pytest.raises(InvalidArgumentError, match=">= 16 characters"):
        hash_token("short")
    assert len(hash_token("x" * 16)) == 64
