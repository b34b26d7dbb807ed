"""The scheduler's policy on plain values: no threads, no sleeps, no model (docs/SERVING.md, *The turn*).

:func:`play` runs :func:`schedule` and :func:`postprocess` turn after turn, the way the
scheduler thread does, and keeps the turn log the properties are checked on.
"""

from __future__ import annotations

from dataclasses import replace

from ragpic.serve.policy import Decoding, Limits, Piece, Request, State, Work, postprocess, schedule

LIMITS = Limits(max_batch=4)


def play(state: State, turns: int, finish_after: dict[int, int] | None = None) -> tuple[State, list]:
    """Up to ``turns`` turns; request ``i`` finishes after ``finish_after[i]`` decode steps
    (default: never). Returns the last state and the turns."""
    steps: dict[int, int] = {}
    log = []
    for _ in range(turns):
        turn = schedule(state)
        log.append(turn)
        done = set()
        for i in turn.decode:
            steps[i] = steps.get(i, 0) + 1
            if finish_after and steps[i] >= finish_after.get(i, 1 << 30):
                done.add(i)
        state = postprocess(state, turn, finished=frozenset(done))
        if not (state.waiting or state.linking or state.compiles or state.running):
            break
    return state, log


def pieces_between_steps(log) -> int:
    """Most pieces any running request waited for between two of its decode steps."""
    worst = since = 0
    for turn in log:
        if turn.decode:
            since += turn.piece is not None
            worst = max(worst, since)
            since = 0
    return worst


def test_a_compile_never_runs_two_pieces_between_two_decode_steps():
    running = tuple(Decoding(i, 100) for i in (1, 2, 3, 4))
    compiles = (Work(10, pieces_left=8, piece_rows=512), Work(11, pieces_left=3, piece_rows=200))
    state = State(LIMITS, running=running, compiles=compiles)
    state, log = play(state, 40, finish_after={i: 30 for i in (1, 2, 3, 4)})
    assert pieces_between_steps(log) == 1
    compile_turns = [t for t in log if t.piece is not None]
    assert len(compile_turns) == 11  # every piece ran, one per turn
    assert all(t.decode == (1, 2, 3, 4) for t in compile_turns)  # each with a decode step of all four
    assert [t.piece.id for t in compile_turns] == [10] * 8 + [11] * 3  # FIFO between compiles
    assert max(t.piece.rows for t in compile_turns) == 512


def test_link_and_compile_alternate_and_neither_starves():
    state = State(LIMITS, waiting=(Request(5, rows=300, pieces=4, piece_rows=64),),
                  running=(Decoding(1, 50),), compiles=(Work(10, pieces_left=4, piece_rows=128),))
    _, log = play(state, 20)
    kinds = [t.piece.kind for t in log if t.piece is not None]
    assert kinds[:8] == ["link", "compile"] * 4
    assert pieces_between_steps(log) == 1
    assert log[0].admit == (5,)


def test_admission_is_fifo_by_batch_slots_and_one_link_at_a_time():
    waiting = tuple(Request(i, rows=10, pieces=2, piece_rows=8) for i in range(1, 7))
    state, log = play(State(LIMITS, waiting=waiting), 30)
    admitted = [t.admit[0] for t in log if t.admit]
    assert admitted == [1, 2, 3, 4]  # four slots, in arrival order
    assert len(state.running) == 4 and [w.id for w in state.waiting] == [5, 6]
    for t in log:  # a new link only once the one before it ended (two pieces each)
        assert len(t.admit) <= 1
    assert [i for i, t in enumerate(log) if t.admit] == [0, 2, 4, 6]


def test_a_request_being_matched_is_passed_over_not_admitted():
    state = State(LIMITS, waiting=(Request(1, ready=False), Request(2, rows=10, pieces=1, piece_rows=10)))
    turn = schedule(state)
    assert turn.admit == (2,) and turn.piece == Piece("link", 2, 10)
    assert schedule(State(LIMITS, waiting=(Request(1, ready=False),))) == schedule(State(LIMITS))


def test_the_kv_budget_holds_requests_back_until_rows_are_free():
    limits = Limits(max_batch=8, max_kv_rows=1000)
    state = State(limits, running=(Decoding(1, 600),),
                  waiting=(Request(2, rows=500, pieces=1, piece_rows=500),
                           Request(3, rows=100, pieces=1, piece_rows=100)))
    turn = schedule(state)
    assert turn.admit == ()  # 600 + 500 > 1000: the head waits, and the small one behind it too (FIFO)
    assert turn.piece is None and turn.decode == (1,)
    freed = postprocess(state, turn, finished=frozenset({1}))
    turn = schedule(freed)
    assert turn.admit == (2,)
    # rows counted are the running requests' and the link's: 2 links, 3 waits for it
    state, log = play(freed, 10)
    assert [t.admit for t in log if t.admit] == [(2,), (3,)]


def test_an_idle_server_admits_a_request_over_the_budget_rather_than_stall():
    state = State(Limits(max_batch=2, max_kv_rows=100), waiting=(Request(1, rows=500, pieces=1, piece_rows=500),))
    assert schedule(state).admit == (1,)


def test_cancelled_work_is_dropped_wherever_it_is():
    state = State(LIMITS, waiting=(Request(1, rows=10, cancelled=True), Request(2, rows=10, pieces=1, piece_rows=10)),
                  linking=Work(3, pieces_left=2, piece_rows=8, rows=20, cancelled=True),
                  compiles=(Work(4, pieces_left=3, piece_rows=100, cancelled=True),
                            Work(5, pieces_left=1, piece_rows=9)),
                  running=(Decoding(6, 10, cancelled=True), Decoding(7, 10)))
    turn = schedule(state)
    assert set(turn.drop) == {1, 3, 4, 6}
    assert turn.decode == (7,)  # the dropped one is not decoded
    assert turn.admit == (2,)  # the cancelled link's slot is free this very turn
    assert turn.piece == Piece("link", 2, 10)
    after = postprocess(state, turn)
    assert [c.id for c in after.compiles] == [5] and [r.id for r in after.running] == [7, 2]
    assert not after.waiting and after.linking is None


def test_a_cancelled_compile_runs_no_further_piece():
    state = State(LIMITS, running=(Decoding(1, 10),), compiles=(Work(4, pieces_left=5, piece_rows=100),))
    state = postprocess(state, schedule(state))
    state = postprocess(state, schedule(state))
    assert state.compiles[0].pieces_left == 3
    state = replace(state, compiles=(replace(state.compiles[0], cancelled=True),))
    turn = schedule(state)
    assert turn.drop == (4,) and turn.piece is None and turn.decode == (1,)
    assert postprocess(state, turn).compiles == ()


def test_abort_drops_everything_and_runs_nothing():
    state = State(LIMITS, abort=True, waiting=(Request(1, rows=5),), linking=Work(2, 1, 5, 5),
                  compiles=(Work(3, 1, 5),), running=(Decoding(4, 5),))
    turn = schedule(state)
    assert sorted(turn.drop) == [1, 2, 3, 4] and turn.piece is None and not turn.decode and not turn.admit


def test_batch_slots_bound_running_plus_linking():
    running = tuple(Decoding(i, 10) for i in (1, 2, 3))
    state = State(LIMITS, running=running, linking=Work(4, 2, 8, 10), waiting=(Request(5, rows=10),))
    assert schedule(state).admit == ()  # a link is in progress
    state = State(LIMITS, running=running + (Decoding(4, 10),), waiting=(Request(5, rows=10),))
    assert schedule(state).admit == ()  # four running: the batch is full
