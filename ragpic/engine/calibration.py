"""``method="auto"``: the fastest link recipe that keeps ``Config.fidelity`` of ``full``'s accuracy,
chosen per model from its calibration (docs/ARCHITECTURE.md §4.9).

``ragpic calibrate --model M`` (:mod:`ragpic.eval.calibrate`) runs a calibration set once and
writes a :class:`Calibration`: per recipe, its share of ``full``'s score on every task and its
link speed-up over ``full`` measured side by side, keyed by the model's fingerprint (weights,
weight format, dtype and tokenizer: another conversion is another model). The file is JSON,
read as data and checked field by field; it lives beside the converted models
(:func:`calibration_path`).

:func:`choose` takes, among the recipes the model can run, the fastest whose share is at
least ``fidelity`` on every task ``full`` can do (``full`` scores >= :data:`CAN_DO` there);
when none is, the most faithful one (the highest worst-task share), and says so. Without a
calibration, ``auto`` is :data:`FALLBACK`, also said once.

A calibration run with ``--compile-behind m`` also holds each recipe linking chunks compiled
behind the ``m`` chunks before them (``qr-2-k4-h1-w-s@prev4``, measured on the RULER prompts,
whose chunks are one document in order). Those KV are nearer ``full``'s, so fewer recomputed
rows keep the same share (docs/RESULTS.md §31-§32): ``choose(..., behind=True)`` picks among
them, for the requests that link most of their chunks from such entries (docs/ARCHITECTURE.md §4.9).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ragpic.core.methods import Method, parse_method, split_variant
from ragpic.errors import ConfigError
from ragpic.paths import cache_dir

__all__ = ["CAN_DO", "FALLBACK", "Calibration", "Choice", "RecipeScore", "calibration_path", "choose",
           "load_calibration", "save_calibration"]

FALLBACK = "legolink-16"
"""``auto`` without a calibration: the default method, EPIC's LegoLink at k = 16."""

CAN_DO = 0.5
"""A task counts for fidelity only where ``full`` scores at least this (RULER's own rule of
thumb: below it, ``full``'s own answers are mostly wrong and a share of them means little)."""

VERSION = 1


@dataclass(slots=True, frozen=True)
class RecipeScore:
    """One recipe's calibration: ``shares[task]`` = its mean score / ``full``'s on that task
    (``None`` where ``full`` scored 0; absent where the recipe was not run on it), ``speedup`` =
    the median over prompts of ``full``'s link time / the recipe's. ``method`` may end in
    ``@prev<m>``: the recipe on chunks compiled behind the ``m`` before them (after the prompt's
    chat opening with ``@chat@prev<m>``, its whole leading text with ``@head@prev<m>``, as
    ``Config(compile_head)`` compiles them)."""

    method: str
    shares: dict[str, float | None]
    speedup: float

    @property
    def behind(self) -> int:
        """How many chunks before each chunk its KV was compiled behind (0: alone)."""
        return split_variant(self.method).behind

    @property
    def link_method(self) -> Method:
        """The link method itself (its ``@`` variants dropped)."""
        return parse_method(split_variant(self.method).method)


@dataclass(slots=True, frozen=True)
class Calibration:
    """A model's calibration: ``full_scores[task]`` is ``full``'s mean score; ``recipes`` in the order run;
    ``setup`` records how the set was made (seeds, lengths, samples) for the report."""

    fingerprint: str
    model: str
    full_scores: dict[str, float]
    recipes: list[RecipeScore]
    setup: dict = field(default_factory=dict)

    def tasks_full_can_do(self) -> list[str]:
        return [t for t, s in self.full_scores.items() if s >= CAN_DO]

    def worst_share(self, recipe: RecipeScore) -> float:
        """The recipe's lowest share over the tasks ``full`` can do that it ran (1.0 when there are none)."""
        shares = [recipe.shares[t] for t in self.tasks_full_can_do() if t in recipe.shares]
        return min((s if s is not None else 0.0 for s in shares), default=1.0)


@dataclass(slots=True, frozen=True)
class Choice:
    """What ``auto`` resolved to, and why (one sentence, for the log and ``ragpic calibrate``)."""

    method: Method
    reason: str
    calibrated: bool


def calibration_path(fingerprint: str, root: str | Path | None = None) -> Path:
    """``<root or cache_dir()>/calibration/<fingerprint, made a file name>.json``."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", fingerprint)
    return Path(root or cache_dir()) / "calibration" / f"{name}.json"


def save_calibration(cal: Calibration, root: str | Path | None = None) -> Path:
    """Write ``cal`` as JSON (atomically: a reader never sees half a file); returns its path."""
    path = calibration_path(cal.fingerprint, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": VERSION, **asdict(cal)}, indent=1))
    tmp.replace(path)
    return path


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def _parse(raw, fingerprint: str) -> Calibration:
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} calibration")
    if raw.get("fingerprint") != fingerprint:
        raise ValueError(f"it calibrates {raw.get('fingerprint')!r}, not {fingerprint!r}")
    full = raw.get("full_scores")
    if not isinstance(full, dict) or not all(isinstance(t, str) for t in full):
        raise ValueError("full_scores must map task names to scores")
    recipes = []
    for i, r in enumerate(raw.get("recipes") or []):
        if not isinstance(r, dict) or not isinstance(r.get("shares"), dict):
            raise ValueError(f"recipes[{i}] must be an object with shares")
        v = split_variant(str(r.get("method")))  # a ConfigError (a ValueError) names it
        if v.quant != "none" or v.head not in ("", "chat", "head") or v.head and not v.behind:
            raise ValueError(f"recipes[{i}].method {r.get('method')!r}: a calibration holds '@prev<m>' variants "
                             f"only, each after '@chat' or '@head' or alone")
        method = parse_method(v.method).name + v.tags
        shares = {str(t): None if s is None else _number(s, f"recipes[{i}].shares[{t!r}]") for t, s in r["shares"].items()}
        recipes.append(RecipeScore(method, shares, _number(r.get("speedup"), f"recipes[{i}].speedup")))
    if not recipes:
        raise ValueError("it holds no recipes")
    setup = raw.get("setup") if isinstance(raw.get("setup"), dict) else {}
    return Calibration(fingerprint, str(raw.get("model", "")),
                       {t: _number(s, f"full_scores[{t!r}]") for t, s in full.items()}, recipes, setup)


def load_calibration(fingerprint: str, root: str | Path | None = None) -> Calibration | None:
    """The model's calibration, or ``None`` when it has none.

    Raises:
        ConfigError: the file exists but is not a calibration of this model (names the file
            and says how to redo it); nothing in it is ever executed.
    """
    path = calibration_path(fingerprint, root)
    if not path.is_file():
        return None
    try:
        return _parse(json.loads(path.read_text()), fingerprint)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"calibration file {path} is unusable ({e}): run `ragpic calibrate` for this model "
                          "again, or delete the file to use auto's fallback") from None


def choose(cal: Calibration | None, fidelity: float, *, probe_runs: bool = True, behind: bool = False) -> Choice:
    """The recipe ``auto`` links with for ``fidelity`` (a share of ``full``, in (0, 1]).

    ``probe_runs``: whether the model runs ragpic's attention function; without it the recipes
    that read the question's attention (:attr:`Method.reads_attention`) are skipped.
    ``behind``: choose for a prompt whose chunks were compiled behind the chunks before them,
    among the calibration's ``@prev<m>`` rows; without any, as for chunks compiled alone.
    """
    if cal is None:
        return Choice(parse_method(FALLBACK), f"auto: this model has no calibration, so it links with "
                      f"{FALLBACK} (run `ragpic calibrate` to choose per model)", calibrated=False)
    runnable = [r for r in cal.recipes if probe_runs or not r.link_method.reads_attention]
    usable, who = [r for r in runnable if r.behind] if behind else [], "auto (chunks compiled behind the ones before)"
    if not usable:
        usable, who = [r for r in runnable if not r.behind], "auto"
    if not usable:
        return Choice(parse_method(FALLBACK), f"auto: no calibrated recipe runs on this model, so it links "
                      f"with {FALLBACK}", calibrated=False)
    keep = [r for r in usable if cal.worst_share(r) >= fidelity]
    if keep:
        best = max(keep, key=lambda r: r.speedup)
        why = (f"{who}: {best.method} is the fastest calibrated recipe keeping {fidelity:.0%} of full's score "
               f"on every task full can do (worst task {cal.worst_share(best):.0%}, {best.speedup:.1f}x)")
    else:
        best = max(usable, key=lambda r: (cal.worst_share(r), r.speedup))
        why = (f"{who}: no calibrated recipe keeps {fidelity:.0%} of full's score on every task full can do; "
               f"{best.method} comes closest (worst task {cal.worst_share(best):.0%}, {best.speedup:.1f}x); "
               "pass method='full' where the answer must be full's, or a lower fidelity")
    return Choice(best.link_method, why, calibrated=True)
