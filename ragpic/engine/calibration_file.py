"""Calibrations on disk: a user's own runs beside the converted models, and the ones that ship.

A calibration is a JSON file, read as data and checked field by field; nothing in it is ever
executed. Each recipe is stored as its fields (:meth:`ragpic.core.methods.Variant.fields`) with its
spelling beside them for a reader; version-1 files (the spelling alone) are still read.

Two places are looked in, in order (:func:`find_calibration`):

- the user's own (``ragpic calibrate``), under ``<cache_dir()>/calibration/``, keyed by the
  model's fingerprint: exactly the weights format and dtype it ran on;
- the shipped ones, ``ragpic/data/calibrations/*.json``, one per model ragpic installs (the
  embedded SmolLM2, ``ragpic model get``'s), keyed by the SHA-256 of the model's GGUF file, so
  every weights format and dtype of that model finds it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from ragpic.core.methods import Variant, parse_variant
from ragpic.engine.calibration import Calibration, RecipeScore
from ragpic.errors import ConfigError
from ragpic.paths import cache_dir

__all__ = ["VERSION", "calibration_path", "find_calibration", "load_calibration", "read_calibration",
           "save_calibration", "shipped_calibrations"]

VERSION = 2


def calibration_path(fingerprint: str, root: str | Path | None = None) -> Path:
    """``<root or cache_dir()>/calibration/<fingerprint, made a file name>.json``."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", fingerprint)
    return Path(root or cache_dir()) / "calibration" / f"{name}.json"


def to_json(cal: Calibration) -> dict:
    """The file's contents: every field, each recipe as its fields and its spelling."""
    raw = asdict(cal)
    raw["recipes"] = [{"name": r.name, "recipe": r.recipe.fields(), "shares": r.shares, "speedup": r.speedup}
                      for r in cal.recipes]
    return {"version": VERSION, **raw}


def save_calibration(cal: Calibration, root: str | Path | None = None) -> Path:
    """Write ``cal`` as JSON (atomically: a reader never sees half a file); returns its path."""
    path = calibration_path(cal.fingerprint, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_json(cal), indent=1) + "\n")
    tmp.replace(path)
    return path


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def _recipe(r: dict, i: int) -> Variant:
    # version 2: the fields; version 1: the spelling (a ConfigError, a ValueError, names what is wrong)
    v = Variant.from_fields(r["recipe"]) if "recipe" in r else parse_variant(str(r.get("method")))
    if v.quant != "none" or v.head not in ("", "chat", "head") or v.head and not v.behind:
        raise ValueError(f"recipes[{i}] {v.name!r}: a calibration holds '@prev<m>' variants only, each after "
                         f"'@chat' or '@head' or alone")
    return v


def read_calibration(raw) -> Calibration:
    """A calibration from a file's parsed JSON; ``ValueError`` naming what is wrong."""
    if not isinstance(raw, dict) or raw.get("version") not in (1, VERSION):
        raise ValueError(f"not a version-1 or version-{VERSION} calibration")
    full = raw.get("full_scores")
    if not isinstance(full, dict) or not all(isinstance(t, str) for t in full):
        raise ValueError("full_scores must map task names to scores")
    recipes = []
    for i, r in enumerate(raw.get("recipes") or []):
        if not isinstance(r, dict) or not isinstance(r.get("shares"), dict):
            raise ValueError(f"recipes[{i}] must be an object with shares")
        shares = {str(t): None if s is None else _number(s, f"recipes[{i}].shares[{t!r}]") for t, s in r["shares"].items()}
        recipes.append(RecipeScore(_recipe(r, i), shares, _number(r.get("speedup"), f"recipes[{i}].speedup")))
    if not recipes:
        raise ValueError("it holds no recipes")
    text = {k: str(raw.get(k) or "") for k in ("fingerprint", "model", "source_sha256")}
    setup, made = ({} if not isinstance(raw.get(k), dict) else raw[k] for k in ("setup", "made"))
    return Calibration(text["fingerprint"], text["model"], {t: _number(s, f"full_scores[{t!r}]") for t, s in full.items()},
                       recipes, setup, text["source_sha256"], made)


def load_calibration(fingerprint: str, root: str | Path | None = None) -> Calibration | None:
    """The user's own calibration of the model with this fingerprint, or ``None`` when it has none.

    Raises:
        ConfigError: the file exists but is not a calibration of this model (names the file
            and says how to redo it).
    """
    path = calibration_path(fingerprint, root)
    if not path.is_file():
        return None
    try:
        cal = read_calibration(json.loads(path.read_text()))
        if cal.fingerprint != fingerprint:
            raise ValueError(f"it calibrates {cal.fingerprint!r}, not {fingerprint!r}")
        return cal
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"calibration file {path} is unusable ({e}): run `ragpic calibrate` for this model "
                          "again, or delete the file to use auto's shipped calibration or fallback") from None


def shipped_calibrations() -> dict[str, Calibration]:
    """The calibrations inside the package, by the SHA-256 of their model's GGUF file."""
    out = {}
    for entry in sorted(resources.files("ragpic").joinpath("data", "calibrations").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            try:
                cal = read_calibration(json.loads(entry.read_text()))
            except ValueError as e:  # the package's own file: a broken install, said plainly
                raise ConfigError(f"the shipped calibration {entry.name} is unusable ({e}): reinstall ragpic") from None
            out[cal.source_sha256] = cal
    return out


def find_calibration(fingerprint: str, source_sha256: str = "", root: str | Path | None = None
                     ) -> tuple[Calibration | None, str]:
    """``(calibration, where)``: the user's own for ``fingerprint``, else the shipped one for the
    model's GGUF file (``source_sha256``), else ``(None, "")``. ``where`` names it for the log."""
    own = load_calibration(fingerprint, root)
    if own is not None:
        return own, f"your calibration ({calibration_path(fingerprint, root)})"
    shipped = shipped_calibrations().get(source_sha256) if source_sha256 else None
    if shipped is not None:
        return shipped, f"the calibration shipped for {shipped.model}"
    return None, ""
