"""``ragpic store check`` for a Redis store (see :mod:`ragpic.cache.tools.check`).

Scans the prefix with SCAN (never KEYS), reads each payload and verifies it. Without
``repair`` nothing is written; with it: corrupt entries are deleted (meta first), meta keys
without a payload and payloads without a meta key (interrupted writes) are deleted,
stored entries missing from their fingerprint's catalog are catalogued and catalog rows
without an intact entry are removed.
"""

from __future__ import annotations

from ragpic.cache.tools.check_result import CheckResult, verify_keyed
from ragpic.cache.format.entry_header import CorruptEntry, read_header
from ragpic.cache.backends.redis.backend import RedisBackend


def check_redis(url: str, *, repair: bool, prefix: str = "ragpic:") -> CheckResult:
    """Check (and with ``repair`` fix) the Redis store at ``url`` under ``prefix``."""
    backend = RedisBackend(url, prefix=prefix, timeout_s=5.0)
    result = CheckResult(target=f"{url} (prefix {prefix!r})", kind="redis", repaired=repair)
    try:
        metas, payloads = set(), set()
        for kind, key in backend.scan_keys():
            (metas if kind == "meta" else payloads).add(key)
        intact: dict[str, tuple[str, str]] = {}  # key -> (fingerprint, text)
        for key in sorted(metas & payloads):
            data = backend.payload(key)
            try:
                if data is None:
                    raise CorruptEntry("payload vanished during the check")
                verify_keyed(key, data)
                head = read_header(data)[0]
            except CorruptEntry as exc:
                result.corrupt += 1
                result.notes.append(f"{key}: {exc}")
                if repair:
                    backend.delete(key)
                continue
            intact[key] = (head["fingerprint"], head["text"])
            result.entries += 1
            result.bytes += len(data)
        for key in sorted(metas ^ payloads):
            result.orphans += 1
            if key in payloads:
                result.orphan_bytes += len(backend.payload(key) or b"")
            if repair:
                backend.delete(key)
        _check_catalogs(backend, intact, result, repair)
    finally:
        backend.close()
    result.notes = result.notes[:20]
    return result


def _check_catalogs(backend: RedisBackend, intact: dict[str, tuple[str, str]], result: CheckResult,
                    repair: bool) -> None:
    catalogs = backend.catalogs()
    for fp, rows in catalogs.items():
        stale = [k for k in rows if intact.get(k, (None,))[0] != fp]
        result.stale_rows += len(stale)
        if repair and stale:
            backend.catalog_remove(fp, stale)
    missing: dict[str, dict[str, str]] = {}
    for key, (fp, text) in intact.items():
        if key not in catalogs.get(fp, {}):
            missing.setdefault(fp, {})[key] = text
    result.uncatalogued = sum(len(m) for m in missing.values())
    if repair:
        for fp, items in missing.items():
            backend.catalog_add(fp, items)
