"""Ray's own token authentication around the cluster (docs/security.md, "Ray's own
authentication"): a head started as ``ray_cluster.yaml`` starts its nodes, with
``RAY_AUTH_MODE=token``, takes a driver that holds its Ray token and no other, so a
process without the token can neither use topics nor read the metadata store."""

from __future__ import annotations

import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.ray_head import head_on_redis, redis_server_binary

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(redis_server_binary() is None, reason="needs redis-server"),
]

# A driver that joins the head at RAY_ADDRESS, makes a topic, produces and reads the
# metadata store; it prints OK only if all of it worked.
DRIVER = """
import sys
from runtime import connect
connect()
from clients import Producer, ScalableTopicsAdmin
from storage.catalog import Catalog
admin = ScalableTopicsAdmin()
topic = "topic://rayauth/ns/" + sys.argv[1]
admin.create_scalable_topic(topic, 1)
admin.wait_until_ready(topic, 60)
with Producer(topic) as producer:
    producer.send(b"v", key="k").result(timeout=60)
assert sys.argv[1] in Catalog().topics("rayauth/ns")
print("OK", admin.get_stats(topic)["records"], flush=True)
"""


def _drive(env: dict[str, str], name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, name],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_a_head_with_rays_token_authentication_takes_only_drivers_holding_its_token(
    tmp_path: Path,
) -> None:
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    home = tmp_path / "home"  # no ~/.ray/auth_token to fall back on
    home.mkdir()
    with head_on_redis(tmp_path / "cluster", num_cpus=1, auth_token=token) as head:
        env = head.env("rayauth") | {"HOME": str(home)}
        admitted = _drive(env, "admitted")
        assert admitted.returncode == 0 and "OK 1" in admitted.stdout, admitted.stderr[-3000:]

        without = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH"}
        wrong = tmp_path / "wrong_token"
        wrong.write_text(secrets.token_hex(32))
        refused_envs = {
            "no token": without,
            "a wrong token": env | {"RAY_AUTH_TOKEN_PATH": str(wrong)},
            "authentication off": without | {"RAY_AUTH_MODE": "disabled"},
        }
        # at once: a driver whose requests go unanswered retries for ~20 s before it fails
        with ThreadPoolExecutor(len(refused_envs)) as pool:
            refusals = dict(zip(refused_envs, pool.map(
                lambda item: _drive(item[1], item[0].replace(" ", "-")), refused_envs.items()
            ), strict=True))  # fmt: skip
        for who, refused in refusals.items():
            assert refused.returncode != 0 and "OK" not in refused.stdout, (who, refused.stdout)
            said = refused.stderr.lower()
            assert "token" in said or "authentic" in said or "failed to connect" in said, (
                who, refused.stderr[-3000:],
            )  # fmt: skip

        check = (  # what the refused drivers left: nothing
            "from runtime import connect; connect(); from storage.catalog import Catalog; "
            "print(sorted(Catalog().topics('rayauth/ns')))"
        )
        topics = subprocess.run(
            [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=120
        )
        assert topics.stdout.strip() == str(["admitted"]), topics.stderr[-3000:]
