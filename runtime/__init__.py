"""Pure domain logic and wiring: layout DAG, hashing, names, config, errors, connect."""

from runtime.connect import connect

__all__ = ["connect"]
