"""Token authentication and tenant/namespace-scoped authorization (docs/security.md).

The operator configures tokens in a JSON document (a file named by
``RAYTOPICS_AUTH_TOKENS_FILE``); each maps to a principal and its grants::

    {"tokens": [
      {"principal": "ops", "sha256": "<hex of the token's SHA-256>",
       "grants": [{"namespace": "*", "actions": ["admin"]}]},
      {"principal": "orders-app", "token": "a-long-random-secret",
       "grants": [{"namespace": "acme/orders", "actions": ["produce", "consume"]}]}
    ]}

A plain ``token`` is hashed on load: only SHA-256 digests are kept in memory or
handed to other processes, so a heap dump or a Ray object never holds a secret,
and no message here ever includes a presented token. Digests are compared with
``hmac.compare_digest`` against every entry, so timing says nothing about which
entry almost matched. No configured tokens means auth is off (the default), so
a local cluster works out of the box.

Actions: ``admin`` implies everything; ``produce`` and ``consume`` imply
``lookup`` (reading the DAG is needed to write or read a topic). A namespace
scope is ``*``, ``tenant/*`` or ``tenant/namespace``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    UnauthenticatedError,
    UnauthorizedError,
)

TOKENS_FILE_ENV = "RAYTOPICS_AUTH_TOKENS_FILE"
TOKEN_ENV = "RAYTOPICS_TOKEN"


class Permission(StrEnum):
    ADMIN = "admin"
    PRODUCE = "produce"
    CONSUME = "consume"
    LOOKUP = "lookup"


_IMPLIED: dict[Permission, frozenset[Permission]] = {
    Permission.ADMIN: frozenset(Permission),
    Permission.PRODUCE: frozenset({Permission.PRODUCE, Permission.LOOKUP}),
    Permission.CONSUME: frozenset({Permission.CONSUME, Permission.LOOKUP}),
    Permission.LOOKUP: frozenset({Permission.LOOKUP}),
}


MIN_TOKEN_CHARS = 16


def hash_token(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored (an operator's ``sha256``
    entry): refused, like a plain ``token`` entry, for fewer than 16 characters."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgumentError(f"a token needs >= {MIN_TOKEN_CHARS} characters")
    return token_digest(token)


def token_digest(token: str) -> str:
    """The digest of a presented token, whatever its length (a short one is simply
    not found)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """Actions allowed on one namespace scope (``*``, ``tenant/*`` or ``tenant/ns``)."""

    scope: str
    actions: frozenset[Permission]

    def covers(self, action: Permission, namespace: str) -> bool:
        return action in self.actions and _in_scope(self.scope, namespace)

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.scope, "actions": sorted(self.actions)}


def _in_scope(scope: str, namespace: str) -> bool:
    if scope in ("*", namespace):
        return True
    tenant, _, rest = scope.partition("/")
    return rest == "*" and namespace.split("/", 1)[0] == tenant


@dataclass(frozen=True)
class Principal:
    name: str
    grants: tuple[Grant, ...]

    def may(self, action: Permission, namespace: str) -> bool:
        return any(grant.covers(action, namespace) for grant in self.grants)


@dataclass(frozen=True)
class AuthPolicy:
    """Who holds which token (by digest) and what each principal may do."""

    principals: tuple[tuple[str, Principal], ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.principals)

    @classmethod
    def from_config(cls, doc: Mapping[str, Any]) -> AuthPolicy:
        """Parse the operator's document, strictly: a misspelled, unknown or missing key
        and an empty list are refused (naming where, and what is allowed), never read
        as "no tokens", so a document meant to turn authentication on cannot turn it
        off. A malformed document is refused as a whole."""
        _keys(doc, "the auth document", required=("tokens",), allowed=("tokens",))
        tokens = doc["tokens"]
        if not isinstance(tokens, list) or not tokens:
            raise InvalidArgumentError(
                "auth document: 'tokens' must be a non-empty list (authentication is "
                "turned off by `raytopics auth disable`, never by an empty document)"
            )
        entries = tuple(_entry(raw, i) for i, raw in enumerate(tokens))
        digests = [digest for digest, _ in entries]
        if len(set(digests)) != len(digests):
            raise InconsistentRequestError("auth document lists the same token twice")
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> AuthPolicy:
        try:
            return cls.from_config(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise InvalidArgumentError(f"cannot read auth config {path}: {err}") from None

    @classmethod
    def from_env(cls) -> AuthPolicy:
        """The policy of ``RAYTOPICS_AUTH_TOKENS_FILE``; auth off when it is unset."""
        path = os.environ.get(TOKENS_FILE_ENV)
        return cls.from_file(path) if path else cls()

    def to_config(self) -> dict[str, Any]:
        """The same policy with digests only: safe to pass to another process."""
        return {
            "tokens": [
                {"principal": p.name, "sha256": digest, "grants": [g.to_dict() for g in p.grants]}
                for digest, p in self.principals
            ]
        }

    def authenticate(self, token: str | None) -> Principal | None:
        """The token's principal (None when auth is off); ``UnauthenticatedError`` if unknown."""
        if not self.enabled:
            return None
        if not token:
            raise UnauthenticatedError(
                "authentication required: present a token (Python: token=..., or "
                f"{TOKEN_ENV} in the environment; CLI: --token-file FILE, --token or "
                f"{TOKEN_ENV}; REST: Authorization: Bearer <token>)"
            )
        presented = token_digest(token)
        found = None
        for digest, principal in self.principals:  # no early exit: constant work per call
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is None:
            raise UnauthenticatedError(
                f"the presented token is not valid (it comes from token=..., else {TOKEN_ENV};"
                " for the CLI --token-file, --token, else "
                f"{TOKEN_ENV}; over REST the Authorization header)"
            )
        return found

    def authorize(self, token: str | None, action: Permission, namespace: str) -> Principal | None:
        """Authenticate, then check ``action`` on ``namespace`` (``tenant/ns``)."""
        principal = self.authenticate(token)
        if principal is not None and not principal.may(action, namespace):
            raise UnauthorizedError(
                f"principal {principal.name!r} may not {action.value} in namespace {namespace}"
            )
        return principal


_ENTRY_KEYS = ("principal", "token", "sha256", "grants")
_GRANT_KEYS = ("namespace", "actions")


def _keys(raw: Any, where: str, *, required: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    """``raw`` is an object whose keys are among ``allowed`` and include ``required``."""
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(f"{where}: must be an object with {', '.join(allowed)}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}"
        )
    missing = [k for k in required if k not in raw]
    if missing:
        raise InvalidArgumentError(f"{where}: missing {missing[0]!r}")


def _entry(raw: Any, index: int) -> tuple[str, Principal]:
    where = f"tokens[{index}]"
    _keys(raw, where, required=("principal", "grants"), allowed=_ENTRY_KEYS)
    if not isinstance(raw["principal"], str) or not raw["principal"]:
        raise InvalidArgumentError(f"{where}: 'principal' must be a non-empty string")
    digest = _digest(raw, index)
    grants = raw["grants"]
    if not isinstance(grants, list) or not grants:
        raise InvalidArgumentError(f"{where}: 'grants' must be a non-empty list")
    return digest, Principal(
        raw["principal"], tuple(_grant(g, index, i) for i, g in enumerate(grants))
    )


def _digest(raw: Mapping[str, Any], index: int) -> str:
    token, digest = raw.get("token"), raw.get("sha256")
    where = f"tokens[{index}]"
    if (token is None) == (digest is None):
        raise InvalidArgumentError(f"{where}: give exactly one of 'token', 'sha256'")
    if token is not None:
        if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
            raise InvalidArgumentError(f"{where}: a token needs >= {MIN_TOKEN_CHARS} characters")
        return hash_token(token)
    if not isinstance(digest, str) or len(digest) != 64 or not _is_hex(digest):
        raise InvalidArgumentError(f"{where}: 'sha256' must be 64 hex digits")
    return digest.lower()


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def _grant(raw: Any, index: int, position: int) -> Grant:
    where = f"tokens[{index}].grants[{position}]"
    _keys(raw, where, required=_GRANT_KEYS, allowed=_GRANT_KEYS)
    scope = raw["namespace"]
    tenant, _, ns = scope.partition("/") if isinstance(scope, str) else ("", "", "")
    if scope != "*" and not (tenant and ns and "/" not in ns and tenant != "*"):
        raise InvalidArgumentError(
            f"{where}: namespace scope {scope!r} must be '*', 'tenant/*' or 'tenant/namespace'"
        )
    return Grant(scope, frozenset(_implied(raw["actions"], where)))


def _implied(actions: Any, where: str) -> Iterable[Permission]:
    allowed = [a.value for a in Permission]
    if not isinstance(actions, list) or not actions or not all(a in allowed for a in actions):
        raise InvalidArgumentError(
            f"{where}: 'actions' must be a non-empty list of {', '.join(allowed)}"
        )
    for action in actions:
        yield from _IMPLIED[Permission(action)]


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, None if absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def default_token() -> str | None:
    """The client's token from ``RAYTOPICS_TOKEN``."""
    return os.environ.get(TOKEN_ENV) or None


def client_credential(token: str | None) -> str | None:
    """What a client presents: its ``token`` argument, else ``RAYTOPICS_TOKEN``. An
    empty string is "no token", not "look in the environment"."""
    return token if token is not None else default_token()
