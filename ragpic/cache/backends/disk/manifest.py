"""``manifest.json`` of a folder store: written once by the folder's creator, never rewritten.

It records what the folder is for (fingerprint, recipes) and the format versions. Entries
are self-describing, so a manifest is advice, not a key to the data: one that cannot be
read (not JSON, not an object, fields of the wrong type) is reported with one warning and
ignored, as if the folder had none (and it is not overwritten: someone may want to look at
it). Only a readable ``format_version`` newer than this ragpic's refuses the folder.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ragpic.cache.format.entry_header import FORMAT_VERSION
from ragpic.errors import ConfigError

log = logging.getLogger("ragpic.cache")

NAME = "manifest.json"
LAYOUT = 2  # 1: diskcache folder (ragpic 0.1), 2: entries/ + index.sqlite
_FIELDS = {"format_version": int, "layout": int, "fingerprint": (str, type(None)), "recipes": list,
           "created": str, "format": str}


def write_once(root: Path, fingerprint: str | None, recipes: list[str]) -> None:
    """Create ``root/manifest.json`` unless it exists (atomic and exclusive: first writer wins).

    Raises:
        OSError: the folder is not writable (callers on read-only folders skip this).
    """
    target = root / NAME
    if target.exists() or target.is_symlink():
        return
    body = {"format": "ragpic-kv-store", "format_version": FORMAT_VERSION, "layout": LAYOUT,
            "fingerprint": fingerprint, "recipes": recipes,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = root / f".manifest.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    try:
        os.link(tmp, target)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def problem(raw: object) -> str | None:
    """Why a parsed manifest is unusable, or ``None`` if its known fields have their types."""
    if not isinstance(raw, dict):
        return f"it is a JSON {type(raw).__name__}, not an object"
    for field, typ in _FIELDS.items():
        if field in raw and (not isinstance(raw[field], typ) or isinstance(raw[field], bool)):
            return f"its {field!r} is {raw[field]!r}, not {getattr(typ, '__name__', 'a string or null')}"
    return None


def read(root: Path) -> tuple[dict[str, Any], str | None]:
    """``(manifest, problem)``: the manifest (``{}`` if absent or unusable) and why it was
    unusable (``None`` if fine or absent). Never raises for a bad file."""
    path = root / NAME
    try:
        if path.is_symlink() or not path.is_file():
            return {}, None if not path.exists() and not path.is_symlink() else "it is not a regular file"
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return {}, f"{type(exc).__name__}: {str(exc)[:200]}"
    why = problem(raw)
    return ({}, why) if why else (raw, None)


def check(root: Path, spec: str, fingerprint: str | None) -> dict[str, Any]:
    """Read the manifest, warn about a bad one, refuse a newer format; return it (or ``{}``).

    Raises:
        ConfigError: the folder's ``format_version`` is newer than this ragpic reads.
    """
    manifest, why = read(root)
    if why:
        log.warning("KV store %s: %s is unreadable (%s); ignoring it (entries are self-describing)",
                    root, NAME, why)
    version = manifest.get("format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise ConfigError(f"store={spec!r} holds KV entries of format version {version}; this ragpic reads "
                          f"up to {FORMAT_VERSION}: upgrade ragpic or pass another folder as store")
    if fingerprint is not None and manifest.get("fingerprint") not in (None, fingerprint):
        log.info("KV store %s was created for fingerprint %r; entries for %r are kept beside them "
                 "(keys are content-addressed)", root, manifest.get("fingerprint"), fingerprint)
    return manifest
