"""A real ``redis-server`` on a free loopback port for tests (no persistence).

Import the fixtures into a test module: ``from redis_server import redis_url, RedisServer``.
Tests skip with a clear reason only when the ``redis-server`` binary is absent
(Debian: ``apt-get install redis-server``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` child process; :meth:`stop` kills it (used to test outages)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server binary not found (apt-get install redis-server)")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="ragpic-redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir.name, "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_ping(self.port, self.proc, self)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._dir.cleanup()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A server of the test module's own (its URL and port), stopped after the module."""
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a session-wide server; tests isolate themselves with unique key prefixes."""
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()


class RedisCluster:
    """A real 3-primary Redis Cluster on loopback ports (no replicas, no persistence).

    ``url`` is ``redis-cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``; :meth:`kill` stops one
    node (its slots then answer CLUSTERDOWN / connection errors), :meth:`stop` all of them.
    """

    def __init__(self, nodes: int = 3) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            pytest.skip("redis-server / redis-cli not found (apt-get install redis-server)")
        self._dir = tempfile.TemporaryDirectory(prefix="ragpic-redis-cluster-")
        self.ports = _cluster_ports(nodes)
        self.procs = []
        for port in self.ports:
            d = f"{self._dir.name}/{port}"
            subprocess.run(["mkdir", "-p", d], check=True)
            self.procs.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", d, "--protected-mode", "no", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"{d}/nodes.conf", "--cluster-node-timeout", "1000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        import redis

        for port, proc in zip(self.ports, self.procs):
            _wait_ping(port, proc, self)
        out = subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                              "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        deadline = time.monotonic() + 20
        for port in self.ports:  # every node must see the whole cluster before tests route keys
            client = redis.Redis(port=port)
            while "cluster_state:ok" not in _cluster_info(client):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the test Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
            client.close()
        self.url = "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)
        self._dir.cleanup()


def _cluster_info(client) -> str:
    """``CLUSTER INFO`` as text (redis-py parses it into a dict; older versions return bytes)."""
    info = client.execute_command("CLUSTER INFO")
    if isinstance(info, dict):
        return "\n".join(f"{k}:{v}" for k, v in info.items())
    return info.decode() if isinstance(info, bytes) else str(info)


def _cluster_ports(n: int) -> list[int]:
    """``n`` ports whose cluster-bus ports (port + 10000) are free too, all below 65536."""
    import random

    rng, out = random.Random(), []
    while len(out) < n:
        port = rng.randrange(20000, 40000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        if port not in out:
            out.append(port)
    return out


def _wait_ping(port: int, proc: subprocess.Popen, owner) -> None:
    """Wait until the redis-server ``proc`` answers PING on ``port``; else ``owner.stop()`` and raise."""
    import redis

    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                owner.stop()
                raise RuntimeError(f"redis-server did not start on port {port}") from None
            time.sleep(0.05)
    client.close()
