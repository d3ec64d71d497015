"""Redis servers of a test's own (password, ACL user, TLS, Sentinel) on free loopback ports.

Each runs in the test's tmp dir with nothing kept on disk; the ``servers`` fixture stops them.
"""

from __future__ import annotations

from pathlib import Path

from tests.harness import OFF_DISK, Procs, free_port, start_redis
from tests.services import require_tool


def assert_not_in_logs(tmp: Path, secret: str) -> None:
    """No log file of the test's processes holds ``secret``."""
    leaked = [p.name for p in tmp.glob("*.log") if secret in p.read_text()]
    assert not leaked, f"the Redis password is in {leaked}"


class RedisServers:
    """redis-server processes of one test (plain, TLS or sentinel)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs = Procs(tmp, grace=10)

    def start(self, *args: str, tls: bool = False, ready: str = "Ready to accept") -> int:
        """Start a server with ``args`` on a free loopback port; returns the port."""
        require_tool("redis-server")
        port = free_port()
        start_redis(self.procs, port, self.tmp, *args, *OFF_DISK, tls=tls, ready=ready)
        return port

    def sentinel(self, master_port: int, master: str, password: str | None = None) -> int:
        """Start a sentinel monitoring ``master`` at ``master_port``; returns its port."""
        conf = self.tmp / f"sentinel-{len(self.procs.procs)}.conf"
        lines = [
            f"sentinel monitor {master} 127.0.0.1 {master_port} 1",
            f"sentinel down-after-milliseconds {master} 1000",
            f"sentinel failover-timeout {master} 4000",
        ]
        if password:
            lines.append(f"sentinel auth-pass {master} {password}")
        conf.write_text("\n".join(lines) + "\n")
        # Sentinel rewrites its config file, so it must be a file of its own.
        return self.start(str(conf), "--sentinel", ready="+monitor master")

    def stop_all(self) -> None:
        self.procs.stop_all()
