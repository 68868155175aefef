"""What the client install lacks, said as such.

The project installs in two sizes (``pyproject.toml``): the client install
(``scalable-topics-on-ray[client]``) has no Ray, Spark or RayDP, and serves a program that
reaches the cluster through its REST gateway only (``Producer(url=...)``,
``AdminHttpClient``); the ``ray`` extra adds what a Ray driver and the cluster need. A
Ray client used in a client install would fail deep in an import, naming a module the
user never asked for; ``ray_required`` says instead what is missing and what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# The top-level modules the ``ray`` extra installs.
RAY_EXTRA_MODULES = frozenset({"ray", "raydp", "pyspark"})


class RayNotInstalledError(ImportError):
    """A part of the client that runs as a Ray driver, used where Ray is not installed."""


@contextlib.contextmanager
def ray_required(what: str) -> Iterator[None]:
    """Turn a missing Ray (or Spark, or RayDP) met while importing for ``what`` into a
    ``RayNotInstalledError`` that says how to install it or how to do without."""
    try:
        yield
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in RAY_EXTRA_MODULES:
            raise
        raise RayNotInstalledError(
            f"{what} needs {missing}, which this installation lacks: install "
            "'scalable-topics-on-ray[ray]' to run as a Ray driver, or reach the cluster "
            "through its REST gateway (Producer(url=...) or RAYTOPICS_URL, "
            "AdminHttpClient, raytopics --url), which the client install serves",
            name=missing,
        ) from None
