"""Redis over TLS (``rediss://``) with a private CA, as an ACL user: store, broker, pipeline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import urlencode

import kombu.exceptions
import pytest
import redis

from broker.app import create_broker_app
from common.settings import Settings
from common.store import connect
from tests.deploy.redis_servers import RedisServers, assert_not_in_logs
from tests.harness import ROOT, Procs
from tests.services import require_tool
from tests.stack import Stack

pytestmark = pytest.mark.integration

USER, PASSWORD = "eaglegen", "tls-acl-pw-5d1e07"
# What docs/deployment.md recommends: no default user, one user without admin commands.
ACL = ["--user", "default", "off",
       "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all", "-@dangerous"]  # fmt: skip


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    require_tool("openssl")
    out = tmp_path / "tls"
    script = ROOT / "scripts" / "redis_tls_certs.sh"
    subprocess.run(["bash", str(script), str(out), "localhost", "127.0.0.1"], check=True,
                   capture_output=True)  # fmt: skip
    return out


def start_tls_redis(servers: RedisServers, certs: Path, client_certs: str = "no") -> int:
    return servers.start(
        *ACL, "--tls-cert-file", str(certs / "redis.crt"), "--tls-key-file",
        str(certs / "redis.key"), "--tls-ca-cert-file", str(certs / "ca.crt"),
        "--tls-auth-clients", client_certs, tls=True,
    )  # fmt: skip


def tls_url(port: int, **ssl_options: str) -> str:
    return f"rediss://{USER}:{PASSWORD}@127.0.0.1:{port}/0?{urlencode(ssl_options)}"


def broker_answers(url: str) -> bool:
    """Whether Celery, configured like every EagleGen process, reaches the broker at ``url``."""
    with create_broker_app(Settings(redis_url=url)).connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        return bool(conn.default_channel.client.ping())


def test_the_pipeline_runs_over_tls_as_an_acl_user(
    servers: RedisServers, certs: Path, procs: Procs, tmp_path: Path
):
    port = start_tls_redis(servers, certs)
    url = tls_url(port, ssl_cert_reqs="required", ssl_ca_certs=str(certs / "ca.crt"))
    stack = Stack(procs, url, tmp_path)
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"tls question {i}"}) + "\n" for i in range(4)))
    stack.simulator()
    stack.worker(concurrency=4)
    stack.collector()
    assert "enqueued 4," in stack.enqueue(source).stdout
    stack.wait_complete(timeout=60)
    assert len({record["id"] for record in stack.lines()}) == 4
    assert_not_in_logs(tmp_path, PASSWORD)


def test_without_the_ca_neither_the_store_nor_the_broker_trusts_the_server(
    servers: RedisServers, certs: Path
):
    # kombu on its own accepts any certificate for a bare rediss:// URL; EagleGen must not.
    url = tls_url(start_tls_redis(servers, certs))
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        connect(url).ping()
    with pytest.raises(kombu.exceptions.OperationalError, match="certificate verify failed"):
        broker_answers(url)


def test_client_certificates_in_the_url_reach_both_clients(servers: RedisServers, certs: Path):
    port = start_tls_redis(servers, certs, client_certs="yes")
    ca = {"ssl_ca_certs": str(certs / "ca.crt")}
    mutual = tls_url(port, **ca, ssl_certfile=str(certs / "client.crt"),
                     ssl_keyfile=str(certs / "client.key"))  # fmt: skip
    assert connect(mutual).ping()
    assert broker_answers(mutual)
    with pytest.raises(redis.ConnectionError):
        connect(tls_url(port, **ca)).ping()
