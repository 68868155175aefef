"""Process-wide settings, each overridable from the environment.

Ray workers inherit the driver's environment only through ``runtime_env``, so
every knob that actors need is read here from ``RAYTOPICS_*`` variables and
can also be passed explicitly.
"""

from __future__ import annotations

import os

DEFAULT_NAMESPACE = "scalable-topics"
GC_FREEZE_ENV = "RAYTOPICS_GC_FREEZE"  # read by clients (clients._ray), forwarded to actors


def ray_namespace() -> str:
    """The Ray namespace (and GCS KV namespace) every actor of the system lives in."""
    return os.environ.get("RAYTOPICS_NAMESPACE", DEFAULT_NAMESPACE)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default
