"""The cluster's authentication policy as operators manage it (``raytopics auth``,
the admin API, ``PUT /admin/v2/auth``): loaded whole, shown without secrets.

Who may manage it is the admin service's check (admin on every namespace);
this module decides what a policy may be and what an operator is shown of it.
A policy nobody could manage afterwards is refused, since only raw access to
the cluster's metadata could undo it. Of a token an operator sees only the
first 8 hex digits of its SHA-256, enough to tell entries apart and to match
one against a token in hand, never the token nor its whole digest.
"""

from __future__ import annotations

from typing import Any

from runtime.auth import AuthPolicy, Permission
from runtime.errors import InconsistentRequestError
from storage.catalog import Catalog
from storage.records import AuthRecord

EVERY_NAMESPACE = "*"
DISABLED = {"enabled": False, "version": 0, "updatedAtMs": None, "principals": []}
FIRST_POLICY_IS_THE_OPERATORS = (
    "no authentication policy is loaded, and the first one is the operator's: load it "
    "from inside the cluster with `raytopics auth load FILE` (a Ray driver of the "
    "cluster) or by starting the gateway with RAYTOPICS_AUTH_TOKENS_FILE; once one is "
    "loaded, an admin on '*' may replace it over REST"
)


def load_policy(catalog: Catalog, document: dict[str, Any]) -> dict[str, Any]:
    """Store ``document`` (validated whole; digests only) as the cluster's policy and
    return its status. The policy already in force is not stored again, so an
    operator's gateway may load its file at every start without a new version."""
    policy = AuthPolicy.from_config(document)
    _require_an_administrator(policy)
    current = catalog.auth()
    if current is None or current.policy != policy.to_config():
        catalog.replace_auth(policy)
    return policy_status(catalog.auth())


def policy_status(record: AuthRecord | None) -> dict[str, Any]:
    """``{"enabled", "version", "updatedAtMs", "principals": [{"principal",
    "sha256Prefix", "grants"}]}`` of the stored policy (``None``: authentication off)."""
    if record is None:
        return dict(DISABLED)
    principals = [
        {
            "principal": principal.name,
            "sha256Prefix": digest[:8],
            "grants": [grant.to_dict() for grant in principal.grants],
        }
        for digest, principal in record.auth_policy().principals
    ]
    return {
        "enabled": True,
        "version": record.version,
        "updatedAtMs": record.updated_at_ms,
        "principals": principals,
    }


def _require_an_administrator(policy: AuthPolicy) -> None:
    if not any(p.may(Permission.ADMIN, EVERY_NAMESPACE) for _, p in policy.principals):
        raise InconsistentRequestError(
            "auth document: no token has admin on namespace '*', so nobody could change "
            "or disable this policy afterwards; grant one principal "
            '{"namespace": "*", "actions": ["admin"]}'
        )
