"""ray_cluster.yaml is a launcher config Ray itself accepts, and it wires up the project.

Runs Ray's own pipeline for `ray up` minus the SSH part: `prepare_config` (the
local provider's node types, then the defaults every config is filled out
with) and `validate_config` (the JSON schema plus Ray's cross-field checks).
The head's GCS must live in the operator's Redis, not on the head: the head is
what restarts or gets replaced (tests/test_head_restart.py shows what survives).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from runtime.connect import LOCAL_SYSTEM_CONFIG

CONFIG = Path(__file__).resolve().parent.parent / "ray_cluster.yaml"
STORAGE_ROOT = "RAYTOPICS_STORAGE_ROOT=/mnt/raytopics/segments"
REDIS_HOST = "raytopics-redis.example.internal"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_ray_accepts_the_config(config: dict) -> None:
    prepared = prepare_config(config)
    validate_config(prepared)  # raises on any error
    assert prepared["head_node_type"] in prepared["available_node_types"]
    assert prepared["max_workers"] == len(config["provider"]["worker_ips"])


def test_no_real_addresses(config: dict) -> None:
    hosts = [config["provider"]["head_ip"], *config["provider"]["worker_ips"], REDIS_HOST]
    assert all(host.endswith(".example.internal") for host in hosts)


def test_setup_installs_the_project_and_sets_the_storage_root(config: dict) -> None:
    setup = " ".join(config["setup_commands"])
    assert 'pip install --quiet -e ".[ray]"' in setup
    assert "RAYTOPICS_STORAGE_ROOT=/mnt/raytopics/segments" in setup
    for commands in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = " ".join(config[commands])
        assert STORAGE_ROOT in starts, commands


def test_head_starts_ray_with_inline_limit_then_the_gateway(config: dict) -> None:
    head = config["head_start_ray_commands"]
    ray_start = next(i for i, cmd in enumerate(head) if "ray start --head" in cmd)
    gateway = next(i for i, cmd in enumerate(head) if "raytopics --address auto serve" in cmd)
    assert f"--system-config='{json.dumps(LOCAL_SYSTEM_CONFIG)}'" in head[ray_start]
    assert gateway > ray_start, "the gateway joins Ray, so it starts after it"
    assert "nohup" in head[gateway] and "--port 8080" in head[gateway]
    assert head[gateway].rstrip().endswith("&"), "serve stays in the foreground"


def _head_ray_start(config: dict) -> list[str]:
    """The head's `ray start --head` as the shell runs it: its own simple command
    (split at `;` and `&&`), words and variable assignments in order."""
    head = " ".join(config["head_start_ray_commands"])
    commands = [c for part in head.split(";") for c in part.split("&&")]
    return shlex.split(next(c for c in commands if "ray start --head" in c))


def test_head_keeps_the_gcs_in_the_operators_redis(config: dict) -> None:
    words = _head_ray_start(config)
    ray = next(i for i, word in enumerate(words) if word.endswith("bin/ray"))
    assignments = dict(w.split("=", 1) for w in words[:ray] if "=" in w)
    host, port = assignments["RAY_REDIS_ADDRESS"].rsplit(":", 1)
    assert host == REDIS_HOST and port.isdigit()
    assert host != config["provider"]["head_ip"], "the GCS must not live only on the head"
    # The password comes from the head's environment, never from this file.
    assert "--redis-password=${RAY_REDIS_PASSWORD:-}" in words[ray:]


def test_only_the_head_talks_to_redis(config: dict) -> None:
    workers = " ".join(config["worker_start_ray_commands"])
    assert "REDIS" not in workers.upper(), "workers find the GCS through the head"


def test_every_ray_process_and_the_gateway_use_rays_token_authentication(config: dict) -> None:
    """A process without the cluster's Ray token cannot connect (tests/test_ray_auth.py)."""
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    starts = [
        command
        for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        if "ray start" in command or "raytopics" in command
    ]
    assert len(starts) == 3, starts  # the head, the gateway, a worker
    for command in starts:
        assert "RAY_AUTH_MODE=token" in command.split(), command
    setup = " ".join(config["setup_commands"])
    assert "chmod 600 ~/.ray/auth_token" in setup and "export RAY_AUTH_MODE=token" in setup
