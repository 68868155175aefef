"""The gateway's OpenAPI 3.1 document (``GET /openapi.json``), generated from its route
table (``actors.gateway.routes.ROUTES``) and the pydantic models each route accepts and
answers (``actors.gateway.documents``), and path parameters described by the
same regexes that validate them (``runtime.names``), so the document cannot
drift from what the gateway does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from actors.gateway.documents import ID_PARAMS, MAX_SEGMENT_ID, ErrorBody
from runtime.names import _DESCRIPTOR, _PART
from runtime.rest import IDEMPOTENCY_KEY

if TYPE_CHECKING:
    from actors.gateway.routes import Route

_REF = "#/components/schemas/{model}"
_IDEMPOTENCY_PARAMETER = {
    "name": IDEMPOTENCY_KEY,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,64}$"},
    "description": "Sent again with the same key (a retry), the operation is applied once "
    "and its completed record is the answer",
}
_STATUS_TEXT = {
    200: "OK",
    401: "No valid bearer token (while the cluster has an authentication policy)",
    403: "The token's principal lacks the permission on this namespace, or (loadAuth) no "
    "policy is stored and the first one is the operator's",
    201: "Created",
    204: "No Content",
    400: "Malformed request: bad JSON, wrong types, unknown fields, invalid names",
    404: "Topic, segment or subscription not found",
    405: "Method not allowed on this path",
    409: "Conflicts with the current state (exists, sealed, not adjacent, in progress)",
    503: "A controller or segment is unavailable",
    504: "Not finished within the gateway's time-out (RAYTOPICS_REST_TIMEOUT_S, 30 s by "
    "default); a change asked for may still complete: read the resource to see its state",
}


def _param_schema(name: str) -> dict[str, Any]:
    """The same regexes that validate names describe them, so they cannot drift."""
    if name in ID_PARAMS:
        return {"type": "integer", "minimum": 0, "maximum": MAX_SEGMENT_ID}
    if name == "descriptor":
        return {"type": "string", "pattern": _DESCRIPTOR.pattern, "example": "0000-7fff-1"}
    return {"type": "string", "pattern": _PART.pattern}


def build_openapi(routes: Sequence[Route]) -> dict[str, Any]:
    """An OpenAPI 3.1 document of ``routes``, schemas generated from their models.

    One document whatever the cluster's authentication state: every operation that
    checks a permission may need a bearer token (while a policy is stored) and may
    answer 401 and 403, and says so; a client generated from it sends a token when
    it has one. No operation promises a 500: one would be a bug, and a fuzzer
    checking the answers against this document finds it."""
    models = {(ErrorBody, "serialization"): None}  # a model can be a body and a reply
    for route in routes:
        if route.body.model_fields:
            models[(route.body, "validation")] = None
        if isinstance(route.returns, type):
            models[(route.returns, "serialization")] = None
    keys, defs = models_json_schema(list(models), ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, keys)
    components: dict[str, Any] = {
        "schemas": defs.get("$defs", {}),
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Scalable Topics on Ray: Admin API",
            "version": "2",
            "description": "Scalable topics (segment DAGs that split and merge) and "
            "segments. Every request is answered within the gateway's time-out "
            "(RAYTOPICS_REST_TIMEOUT_S, 30 s by default) or its operation's own where its "
            "504 response names a longer one, with 504 once it has passed.",
        },
        "paths": paths,
        "components": components,
    }


def _operation(route: Route, keys: Mapping[tuple[type, str], dict[str, Any]]) -> dict[str, Any]:
    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return keys[(model, mode)]

    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _param_schema(name)}
        for name in re.findall(r"{(\w+)}", route.path)
    ]
    query = route.query.model_json_schema()
    for name, schema in query.get("properties", {}).items():
        required = name in query.get("required", ())
        description = schema.pop("description", "")
        parameters.append(
            {"name": name, "in": "query", "required": required, "schema": schema}
            | {"description": description}
        )
    if route.idempotent:
        parameters.append(_IDEMPOTENCY_PARAMETER)
    success: dict[str, Any] = {"description": _STATUS_TEXT[route.status]}
    if route.returns is not None:
        returns = route.returns
        schema = ref(returns, "serialization") if isinstance(returns, type) else returns
        success["content"] = {"application/json": {"schema": schema}}
    error = {"application/json": {"schema": ref(ErrorBody, "serialization")}}
    responses = {str(route.status): success}
    guarded = route.operation is not None  # a call into the cluster, checked there
    refusals = (401, 403) if guarded else ()
    timeout = (504,) if guarded else ()
    for status in (*route.errors, *refusals, 405, *timeout):
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": error}
    own_s = route.operation.timeout_s if route.operation is not None else None
    if timeout and own_s is not None:
        responses["504"]["description"] = (
            f"Not finished within {own_s:g} s (this operation's time-out; the gateway's, "
            "RAYTOPICS_REST_TIMEOUT_S, if longer); a change asked for may still complete: "
            "read the resource to see its state"
        )
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if guarded:  # none: any authenticated caller (it acts on what the caller holds)
        operation["x-permission"] = getattr(route.permission, "value", "authenticated")
    if guarded:  # a token while a policy is stored, none while there is none
        operation["security"] = [{"bearerAuth": []}, {}]
    if route.body.model_fields:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": ref(route.body, "validation")}},
        }
    return operation
