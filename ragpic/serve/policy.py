"""The scheduler's policy as a pure function: a snapshot in, the next turn out (docs/SERVING.md, *The turn*).

In the spirit of nano-vllm's and vLLM v1's schedulers, :func:`schedule` decides and the
scheduler thread (:mod:`.scheduler`) only executes: no threads, clocks, tensors or model here,
so every rule is unit-tested on plain values (tests/serve/test_serve_policy.py).

One turn:

1. **drop** every cancelled request or compile, wherever it is (all of them on ``abort``);
2. **admit** the first waiting request that is ready (matched against the store, link
   planned), FIFO, when no link is in progress, a batch slot is free and its KV rows fit the
   budget with the running requests' (``max_kv_rows``; an idle server admits it anyway: it
   was checked against the whole budget on arrival). A ready request that does not fit
   blocks the ones behind it, so a large request is never starved by small ones;
3. run **one piece**, at most ``piece_rows`` rows: the link's next piece or the first
   compile's next piece; when both wait they alternate (``last_piece``), so neither starves;
4. **decode** one step for every running request not dropped.

So between two decode steps at most one bounded piece runs: a link or a compile delays each
running stream's next token by one piece, never by a whole link or a whole compile.
:func:`postprocess` is the state the turn leaves (what the scheduler carries: ``last_piece``;
what the tests use to play many turns with no model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Decoding", "Limits", "Piece", "Request", "State", "Turn", "Work", "postprocess", "schedule"]


@dataclass(frozen=True, slots=True)
class Limits:
    """``max_batch``: requests linking or decoding at once; ``max_kv_rows``: KV rows (prompt +
    ``max_tokens`` each) the linking and running requests may hold together (None: no budget)."""

    max_batch: int
    max_kv_rows: int | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """A waiting request: ``rows`` of KV once linked (prompt + max new tokens), its link's
    ``pieces`` of at most ``piece_rows`` rows; ``ready`` False while it is being matched."""

    id: int
    rows: int = 0
    pieces: int = 1
    piece_rows: int = 0
    ready: bool = True
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Work:
    """A link or compile in progress: ``pieces_left``, each of at most ``piece_rows`` rows;
    ``rows``: KV rows it holds (a link: its request's cache; a compile: 0)."""

    id: int
    pieces_left: int
    piece_rows: int
    rows: int = 0
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Decoding:
    """A running request holding ``rows`` of KV."""

    id: int
    rows: int
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class State:
    limits: Limits
    waiting: tuple[Request, ...] = ()
    linking: Work | None = None
    compiles: tuple[Work, ...] = ()
    running: tuple[Decoding, ...] = ()
    last_piece: str | None = None  # "link" or "compile": which ran last, for alternation
    abort: bool = False  # shutdown grace over: drop everything


@dataclass(frozen=True, slots=True)
class Piece:
    kind: str  # "link" or "compile"
    id: int
    rows: int


@dataclass(frozen=True, slots=True)
class Turn:
    admit: tuple[int, ...] = ()
    piece: Piece | None = None
    decode: tuple[int, ...] = ()
    drop: tuple[int, ...] = ()


def _gone(item, abort: bool) -> bool:
    return abort or item.cancelled


def schedule(state: State) -> Turn:
    """The next turn for ``state`` (see the module docstring for the rules)."""
    ab = state.abort
    every = (*state.waiting, *((state.linking,) if state.linking else ()), *state.compiles, *state.running)
    drop = tuple(x.id for x in every if _gone(x, ab))
    if ab:
        return Turn(drop=drop)
    running = [r for r in state.running if not r.cancelled]
    link = state.linking if state.linking is not None and not state.linking.cancelled else None
    admit: tuple[int, ...] = ()
    if link is None:
        head = next((w for w in state.waiting if w.ready and not w.cancelled), None)
        used = sum(r.rows for r in running)
        budget = state.limits.max_kv_rows
        fits = budget is None or used + (head.rows if head else 0) <= budget or not running
        if head is not None and len(running) < state.limits.max_batch and fits:
            admit = (head.id,)
            link = Work(head.id, head.pieces, head.piece_rows, head.rows)
    compile_ = next((c for c in state.compiles if not c.cancelled and c.pieces_left > 0), None)
    piece = None
    if link is not None and (compile_ is None or state.last_piece != "link"):
        piece = Piece("link", link.id, link.piece_rows)
    elif compile_ is not None:
        piece = Piece("compile", compile_.id, compile_.piece_rows)
    return Turn(admit=admit, piece=piece, decode=tuple(r.id for r in running), drop=drop)


def postprocess(state: State, turn: Turn, *, finished: frozenset[int] = frozenset(),
                next_rows: dict[int, int] | None = None) -> State:
    """The state ``turn`` leaves: dropped items gone, the admitted request linking, the piece
    counted (a finished link's request running, a finished compile gone), ``finished`` running
    requests gone. ``next_rows``: rows of a compile's following piece (default: the same)."""
    gone = set(turn.drop) | set(finished)
    waiting = tuple(w for w in state.waiting if w.id not in gone and w.id not in turn.admit)
    linking = state.linking if state.linking is not None and state.linking.id not in gone else None
    for w in state.waiting:
        if w.id in turn.admit:
            linking = Work(w.id, w.pieces, w.piece_rows, w.rows)
    compiles = [c for c in state.compiles if c.id not in gone]
    running = [r for r in state.running if r.id not in gone]
    p = turn.piece
    if p is not None and p.kind == "link" and linking is not None:
        linking = replace(linking, pieces_left=linking.pieces_left - 1)
        if linking.pieces_left <= 0:
            running.append(Decoding(linking.id, linking.rows))
            linking = None
    elif p is not None:
        rows = (next_rows or {}).get(p.id)
        compiles = [replace(c, pieces_left=c.pieces_left - 1, piece_rows=c.piece_rows if rows is None else rows)
                    if c.id == p.id else c for c in compiles]
        compiles = [c for c in compiles if c.pieces_left > 0]
    return replace(state, waiting=waiting, linking=linking, compiles=tuple(compiles), running=tuple(running),
                   last_piece=p.kind if p is not None else state.last_piece)
