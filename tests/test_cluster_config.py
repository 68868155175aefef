"""ray_cluster.yaml is a launcher config Ray itself accepts, and it wires up the project.

Runs Ray's own pipeline for `ray up` minus the SSH part: `prepare_config` (the
local provider's node types, then the defaults every config is filled out
with) and `validate_config` (the JSON schema plus Ray's cross-field checks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from runtime.connect import LOCAL_SYSTEM_CONFIG

CONFIG = Path(__file__).resolve().parent.parent / "ray_cluster.yaml"
STORAGE_ROOT = "RAYTOPICS_STORAGE_ROOT=/mnt/raytopics/segments"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_ray_accepts_the_config(config: dict) -> None:
    prepared = prepare_config(config)
    validate_config(prepared)  # raises on any error
    assert prepared["head_node_type"] in prepared["available_node_types"]
    assert prepared["max_workers"] == len(config["provider"]["worker_ips"])


def test_no_real_addresses(config: dict) -> None:
    hosts = [config["provider"]["head_ip"], *config["provider"]["worker_ips"]]
    assert all(host.endswith(".example.internal") for host in hosts)


def test_setup_installs_the_project_and_sets_the_storage_root(config: dict) -> None:
    setup = " ".join(config["setup_commands"])
    assert "pip install --quiet -e ." in setup
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
