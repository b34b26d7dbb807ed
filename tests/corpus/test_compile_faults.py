"""A store that fails during ``ragpic compile`` fails the run, loudly: never a success with
chunks missing (real Redis and Redis Cluster servers, tiny random model)."""

from __future__ import annotations

import pytest

from corpus_helpers import write_corpus
from redis_server import RedisCluster, RedisServer
from tiny import saved_tiny_model

import ragpic.corpus.local as local
from ragpic.cli.main import main
from ragpic.corpus import CompileJob, read_sources
from ragpic.errors import StoreError

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs", sentences=30)


def test_a_redis_node_lost_mid_run_fails_it_naming_the_chunk(model, corpus, monkeypatch):
    cluster = RedisCluster()
    try:
        batches = []

        def then_kill(*args, **kw):  # the second batch onwards meets a cluster missing a node
            result = compile_batch(*args, **kw)
            batches.append(result)
            if len(batches) == 1:
                cluster.kill(1)
            return result

        compile_batch = local.compile_batch
        monkeypatch.setattr(local, "compile_batch", then_kill)
        job = CompileJob(store=cluster.url, model=model, chunk_tokens=32, batch_chunks=8)
        with pytest.raises(StoreError, match=r"doc\d\.(txt|md)#\d+"):
            local.compile_in_process(job, read_sources([corpus]), progress=False)
        assert len(batches) == 1 and batches[0].compiled > 0
    finally:
        cluster.stop()


def test_chunks_lost_during_the_run_fail_it(model, corpus, monkeypatch):
    """Entries that vanish after their batch was written (an eviction, a flush, a node replaced
    without its data) are found by the check at the end: the report fails, naming how many."""
    import redis

    server = RedisServer()
    try:
        client, lost = redis.Redis(port=server.port), []

        def then_lose(*args, **kw):
            result = compile_batch(*args, **kw)
            if not lost:
                lost.extend(result.keys)
                client.delete(*[f"ragpic:{part}:{k}" for k in result.keys for part in ("kv", "meta")])
            return result

        compile_batch = local.compile_batch
        monkeypatch.setattr(local, "compile_batch", then_lose)
        job = CompileJob(store=server.url, model=model, chunk_tokens=32, batch_chunks=8)
        report = local.compile_in_process(job, read_sources([corpus]), progress=False)
        assert not report.ok and report.missing == len(lost) == 8
        assert report.lines()[-1] == f"FAILED: 8 of {report.distinct} chunks are not in the store"
    finally:
        server.stop()


def test_a_redis_out_of_memory_fails_the_command(model, corpus, capsys):
    """A Redis at its maxmemory either refuses writes or evicts entries: either way exit 1."""
    import redis

    server = RedisServer()
    try:
        client = redis.Redis(port=server.port)
        client.config_set("maxmemory", client.info("memory")["used_memory"] + 400_000)  # a third of the corpus
        client.config_set("maxmemory-policy", "allkeys-lru")
        code = main(["compile", str(corpus), "--store", server.url, "--model", model, "--chunk-tokens", "32",
                     "--kv-quant", "none", "--quiet"])
        captured = capsys.readouterr()
        assert code == 1
        assert "chunks are not in the store" in captured.out or "could not be stored" in captured.err
    finally:
        server.stop()


def test_a_store_down_at_the_start_stores_nothing_in_memory(model, corpus, capsys):
    server = RedisServer()
    url = server.url
    server.stop()
    assert main(["compile", str(corpus), "--store", url, "--model", model, "--quiet"]) == 1
    assert "could not be opened" in capsys.readouterr().err
