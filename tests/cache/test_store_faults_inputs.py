"""Store specs (paths and URLs) checked where they enter, and the ``ragpic store check`` command.

A store spec is checked where it enters: an empty path, an unknown URL scheme or a value
that is not a path is refused with a ConfigError naming ``store`` and what to pass; ``~``
is expanded. ``ragpic store check`` reports entries, bytes, corrupt and orphaned counts and
``--repair`` fixes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cache_helpers import FP, make_chunk
from ragpic import Config, RagPic
from ragpic.cache import open_store
from ragpic.cache.backends.disk.folder import entry_path
from ragpic.cache.backends.spec import parse_store
from ragpic.errors import ConfigError
from tiny import tiny_lm

WHAT = r"pass a folder path \(e\.g\. ragpic\.kv_folder\('my_index'\)\), 'redis://host:6379/0' \(or rediss://\), " \
       r"'redis-cluster://host:7000,host:7001', or None for memory only"


@pytest.mark.parametrize("spec, message", [
    ("", r"store='' is empty \(it would write into the current directory\): " + WHAT),
    ("   ", r"store='   ' is empty \(it would write into the current directory\): " + WHAT),
    ("unix:///tmp/redis.sock", r"store='unix:///tmp/redis.sock': unknown scheme 'unix://' \(ragpic stores KV in a "
                               r"folder or in Redis, never under a URL it does not know\): " + WHAT),
    ("http://kv-host/kv", r"store='http://kv-host/kv': unknown scheme 'http://' .*" + WHAT),
    ("S3://bucket/kv", r"store='S3://bucket/kv': unknown scheme 's3://' .*" + WHAT),
    ("file://otherhost/kv", r"a file:// URL must name a local folder \(file:///abs/path\)"),
    ("redis://host:notaport/0", r"store='redis://host:notaport/0' is not a valid Redis URL .*: pass redis://host:port/db"),
    (5, r"store must be a str or a path, got int 5: " + WHAT),
    (b"kv", r"store must be a str or a path, got bytes b'kv': " + WHAT),
])
def test_bad_store_specs_are_refused_naming_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  spec: object, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        open_store(spec, fingerprint=FP)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing was created anywhere


def test_the_engine_refuses_a_bad_store_before_touching_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    lm = tiny_lm()
    for spec in ("", "unix:///tmp/x", "http://h/kv"):
        with pytest.raises(ConfigError, match=r"store="):
            RagPic(Config(store=spec), lm=lm)
    assert list(tmp_path.iterdir()) == []


def test_good_specs_are_normalised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_store("~/kv").target == str(tmp_path / "kv")
    assert parse_store(None).kind == parse_store("memory").kind == "memory"
    assert parse_store(f"file://{tmp_path}/a%20b").target == f"{tmp_path}/a b"
    assert parse_store(tmp_path / "x").target == str(tmp_path / "x")
    assert parse_store("rediss://:pw@h:6380/2").kind == "redis"
    store = open_store("~/kv", fingerprint=FP)
    assert store.backend.path == tmp_path / "kv" and (tmp_path / "kv" / "manifest.json").is_file()
    store.close()


def _damaged_folder(root: Path) -> list[str]:
    """4 entries: one truncated, one orphaned temp file, one uncatalogued, one stale row."""
    store = open_store(root, fingerprint=FP)
    items = {k: (kv, t) for k, kv, t in (make_chunk(s, tokens=64) for s in range(4))}
    store.put_many(items)
    keys = list(items)
    f = entry_path(root, keys[0])
    f.write_bytes(f.read_bytes()[:-5])
    f.with_name(f"{keys[1]}.otherhost-1-abcd.tmp").write_bytes(b"x" * 100)
    os.utime(f.with_name(f"{keys[1]}.otherhost-1-abcd.tmp"), (0, 0))
    store.backend._db.query("DELETE FROM entries WHERE key = ?", (keys[2],))
    entry_path(root, keys[3]).unlink()
    store.close()
    return keys


def test_store_check_reports_and_repairs_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from ragpic.cli import main

    keys = _damaged_folder(tmp_path)
    assert main(["store", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"folder store {tmp_path}: needs repair (--repair)" in out
    for line in ("entries       2 intact", "corrupt       1", "orphaned      1 (100 bytes)", "uncatalogued  1",
                 "stale rows    2"):
        assert line in out, out
    assert f"note: {keys[0]}: payload is" in out
    assert main(["store", "check", "--repair", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["store", "check", "--json", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] and report["entries"] == 2 and report["corrupt"] == report["orphans"] == 0
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    assert set(store.texts()) == {keys[1], keys[2]} and set(store.get_many(keys)) == {keys[1], keys[2]}
    store.close()


def test_store_check_refuses_what_is_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from ragpic.cli.store import add_parser, run

    import argparse

    parser = argparse.ArgumentParser(prog="ragpic")
    add_parser(parser.add_subparsers(dest="command"))
    for target, message in ((str(tmp_path / "none"), "no KV store folder at"), ("", "is empty"),
                            ("memory", "needs a folder or a redis:// URL")):
        assert run(parser.parse_args(["store", "check", target])) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
