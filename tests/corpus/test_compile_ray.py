"""``ragpic compile --ray`` on a real local Ray cluster (a head and one worker node, started with
``ray start`` on loopback) writing into a real Redis: the same keys as an in-process run, a
second run that compiles nothing, and a compile actor killed mid-run, after which the run still
ends ok with every chunk stored once and the store checking clean (tiny random model)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from corpus_helpers import folder_keys, write_corpus
from redis_server import RedisServer
from serve_helpers import free_port
from tiny import saved_tiny_model

pytest.importorskip("ray")
pytestmark = pytest.mark.redis

RAY = str(Path(sys.executable).with_name("ray"))
# The test cluster runs without Ray's token auth (loopback only). Said explicitly for every Ray
# process: a local `ray.init()` (e.g. `ragpic compile --ray` with no address) leaves
# ~/.ray/auth_token behind, and Ray's `ray start` then turns auth on for a head but not for a
# worker node, which cannot join.
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def ray_address():
    """A head node and a worker node, one CPU each, on 127.0.0.1 (stopped after the module)."""
    port, temp = free_port(), tempfile.mkdtemp(prefix="/tmp/rp")  # short: Ray's socket paths have a limit
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    try:
        for args in (["--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", temp],
                     ["--address", f"127.0.0.1:{port}"]):
            out = subprocess.run([RAY, "start", *args, *common], capture_output=True, text=True, env=ENV, timeout=120)
            assert out.returncode == 0, f"ray start {args[0]} failed:\n{out.stdout[-1500:]}{out.stderr[-1500:]}"
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def redis_keys(port: int) -> set[str]:
    import redis

    return {k.decode().removeprefix("ragpic:meta:") for k in redis.Redis(port=port).scan_iter("ragpic:meta:*")}


def compile_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ragpic.cli", "compile", *args, "--chunk-tokens", "32", "--quiet", "--json"]


def run_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert out.returncode == 0, out.stderr[-1500:]
    return json.loads(out.stdout)


def test_ray_stores_the_keys_an_in_process_run_stores(ray_address, model, tmp_path):
    corpus = write_corpus(tmp_path / "docs", sentences=40)
    server = RedisServer()
    try:
        here = run_json(compile_cmd(str(corpus), "--store", str(tmp_path / "kv"), "--model", model))
        on_ray = run_json(compile_cmd(str(corpus), "--store", server.url, "--model", model, "--ray", ray_address,
                                      "--workers", "2", "--batch", "8"))
        assert on_ray["ok"] and on_ray["ray"] and on_ray["compiled"] == here["compiled"] > 0
        assert (on_ray["documents"], on_ray["chunks"], on_ray["distinct"]) == \
            (here["documents"], here["chunks"], here["distinct"])
        assert redis_keys(server.port) == folder_keys(tmp_path / "kv")
        assert all(w["batches"] > 0 for w in on_ray["workers"].values())
        again = run_json(compile_cmd(str(corpus), "--store", server.url, "--model", model, "--ray", ray_address,
                                     "--workers", "2"))
        assert again["ok"] and again["compiled"] == 0 and again["stored_before"] == here["chunks"]
    finally:
        server.stop()


def _compile_actors() -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in ps.splitlines() if "MapBatches(CompileWorker)" in line
            and "defunct" not in line]


def test_a_compile_actor_killed_mid_run_loses_nothing(ray_address, model, tmp_path):
    corpus = write_corpus(tmp_path / "docs", sentences=120, seed=2)
    server = RedisServer()
    try:
        cmd = compile_cmd(str(corpus), "--store", server.url, "--model", model, "--ray", ray_address,
                          "--workers", "2", "--batch", "4")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline, victim = time.monotonic() + 300, None
        while time.monotonic() < deadline and proc.poll() is None:
            actors = _compile_actors()
            if actors and len(redis_keys(server.port)) >= 40:
                victim = actors[0]
                stored_at_kill = len(redis_keys(server.port))
                os.kill(victim, signal.SIGKILL)
                break
            time.sleep(0.05)
        assert victim is not None, "the run ended before an actor could be killed: " + (proc.communicate()[1] or "")[-800:]
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-1500:]
        report = json.loads(out)
        assert report["ok"] and report["missing"] == 0
        assert stored_at_kill < report["distinct"] == len(redis_keys(server.port))  # each chunk once
        # Which actor ends up doing the dead one's batches is Ray's timing: a restarted actor, or the
        # surviving one when it drains the queue first (a run with one worker key is correct too).
        assert sum(w["chunks"] for w in report["workers"].values()) >= report["distinct"]
        check = subprocess.run([sys.executable, "-m", "ragpic.cli", "store", "check", server.url],
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        server.stop()
