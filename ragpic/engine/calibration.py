"""``method="auto"``: the fastest recipe that keeps ``Config.fidelity`` of ``full``'s accuracy on this
model, chosen from its calibration (docs/ARCHITECTURE.md §4.9).

A :class:`Calibration` holds, per recipe, its share of ``full``'s score on every task of the
calibration set and its link speed-up over ``full``, measured side by side (``ragpic calibrate``,
:mod:`ragpic.eval.calibrate`). The models ragpic installs ship theirs inside the package; a
user's own run is kept beside the converted models (:mod:`ragpic.engine.calibration_file`).

:func:`choose` takes, among the recipes the model can run, the fastest whose share is at least
``fidelity`` on every task ``full`` can do (``full`` scores >= :data:`CAN_DO` there); when none
is, the most faithful one (the highest worst-task share), and says so. Without a calibration,
``auto`` is :data:`FALLBACK`, said once with the command that calibrates the model.

A calibration run with ``--compile-behind m`` also holds each recipe linking chunks compiled
behind the ``m`` chunks before them (``balanced@prev4``, measured on the RULER prompts, whose
chunks are one document in order): ``choose(..., behind=True)`` picks among those rows, for the
requests that link most of their chunks from such entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ragpic.core.methods import Method, Variant, parse_method, parse_variant

__all__ = ["CAN_DO", "FALLBACK", "Calibration", "Choice", "RecipeScore", "choose"]

FALLBACK = "balanced"
"""``auto`` on a model with no calibration: the preset with the best worst-task share, across the
shipped calibrations, among those linking >= 6x faster than ``full`` (docs/RESULTS.md, *Choosing a
method*)."""

CAN_DO = 0.5
"""A task counts for fidelity only where ``full`` scores at least this (RULER's own rule of
thumb: below it, ``full``'s own answers are mostly wrong and a share of them means little)."""


@dataclass(slots=True, frozen=True)
class RecipeScore:
    """One recipe's calibration.

    Attributes:
        recipe: the recipe as fields (a name is parsed: :func:`ragpic.core.methods.parse_variant`);
            ``recipe.behind`` > 0: on chunks compiled behind the ``behind`` chunks before them
            (after the prompt's chat opening with ``head="chat"``, its whole leading text with
            ``head="head"``, as ``Config(compile_head)`` compiles them).
        shares: ``task -> `` its mean score / ``full``'s there (``None`` where ``full`` scored 0;
            absent where the recipe did not run it).
        speedup: the median over prompts of ``full``'s link time / the recipe's.
    """

    recipe: Variant
    shares: dict[str, float | None]
    speedup: float

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, Variant):
            object.__setattr__(self, "recipe", parse_variant(self.recipe))

    @property
    def name(self) -> str:
        """The recipe's canonical spelling (``balanced``, ``legolink-16@head@prev4``)."""
        return self.recipe.name

    @property
    def behind(self) -> int:
        """How many chunks before each chunk its KV was compiled behind (0: alone)."""
        return self.recipe.behind


@dataclass(slots=True, frozen=True)
class Calibration:
    """A model's calibration.

    Attributes:
        fingerprint: the fingerprint of the model the set ran on (weights, weight format, dtype,
            tokenizer: :func:`ragpic.core.fingerprint.model_fingerprint`).
        model: what the run was given as the model (a name or path), for the report.
        full_scores: ``task ->`` ``full``'s mean score.
        recipes: in the order run.
        setup: how the set was made (seed, tasks, lengths, samples, dtype, device).
        source_sha256: SHA-256 of the model's GGUF file when it came from one (``""``: not); the
            key under which every weights format and dtype of that model finds a shipped calibration.
        made: where and how it was measured (``command``, ``machine``, ``date``), for the reader.
    """

    fingerprint: str
    model: str
    full_scores: dict[str, float]
    recipes: list[RecipeScore]
    setup: dict = field(default_factory=dict)
    source_sha256: str = ""
    made: dict = field(default_factory=dict)

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


def choose(cal: Calibration | None, fidelity: float, *, probe_runs: bool = True, behind: bool = False,
           where: str = "its calibration") -> Choice:
    """The recipe ``auto`` links with for ``fidelity`` (a share of ``full``, in (0, 1]).

    ``probe_runs``: whether the model runs ragpic's attention function; without it the recipes
    that read the question's attention (:attr:`Method.reads_attention`) are skipped.
    ``behind``: choose for a prompt whose chunks were compiled behind the chunks before them,
    among the calibration's ``@prev<m>`` rows; without any, as for chunks compiled alone.
    ``where``: how the reason names the calibration (its file, or the shipped one).
    """
    fallback = parse_method(FALLBACK)
    if fallback.reads_attention and not probe_runs:
        fallback = parse_method("fast")  # reads no attention: runs on every model
    if cal is None:
        return Choice(fallback, f"auto: this model has no calibration, so it links with {fallback.label} (run "
                      f"`ragpic calibrate --model <your model>` once to choose per model)", calibrated=False)
    runnable = [r for r in cal.recipes if probe_runs or not r.recipe.method.reads_attention]
    usable, who = [r for r in runnable if r.behind] if behind else [], "auto (chunks compiled behind the ones before)"
    if not usable:
        usable, who = [r for r in runnable if not r.behind], "auto"
    if not usable:
        return Choice(fallback, f"auto: no calibrated recipe runs on this model, so it links with {fallback.label}",
                      calibrated=False)
    keep = [r for r in usable if cal.worst_share(r) >= fidelity]
    if keep:
        best = max(keep, key=lambda r: r.speedup)
        why = (f"{who}: {best.recipe.label} is the fastest recipe in {where} keeping {fidelity:.0%} of full's "
               f"score on every task full can do (worst task {cal.worst_share(best):.0%}, {best.speedup:.1f}x)")
    else:
        best = max(usable, key=lambda r: (cal.worst_share(r), r.speedup))
        why = (f"{who}: no recipe in {where} keeps {fidelity:.0%} of full's score on every task full can do; "
               f"{best.recipe.label} comes closest (worst task {cal.worst_share(best):.0%}, "
               f"{best.speedup:.1f}x); pass method='full' where the answer must be full's, or a lower fidelity")
    return Choice(best.recipe.method, why, calibrated=True)
