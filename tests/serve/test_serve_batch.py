"""Continuous batching's decode step: a ``(B, 1)`` forward over B requests' own linked caches
gives each request the same greedy tokens as decoding it alone (tiny random models)."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.batch import BatchedCache, supports_batching
from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.link import link
from ragpic.core.runner import runner_for
from ragpic.core.segments import text_segment
from tiny import tiny_lm

PROMPTS = ["the quick brown fox jumps over the lazy dog. a needle hides",
           "question: what is the best thing to do in san francisco? answer:",
           "passages are compiled once and linked many times; positions move, the keys rotate with them. "
           "the quick brown fox"]


def batched_decode_step(lm, caches, tokens, positions):
    """The runner's decode of ``tokens[b]`` at ``positions[b]`` into ``caches[b]``: ``(B, V)``."""
    return runner_for(lm).decode(torch.tensor(tokens), positions, caches)


def alone(lm, text: str, n: int) -> list[int]:
    res = link(lm, [text_segment(lm.tokenizer, text)], "full", extra_capacity=n)
    return list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=n)))


def batched(lm, texts: list[str], n: int, starts: list[int]) -> list[list[int]]:
    """Greedy-decode every text, row ``b`` joining the batch at step ``starts[b]``."""
    links = [link(lm, [text_segment(lm.tokenizer, t)], "full", extra_capacity=n) for t in texts]
    out = [[int(r.logits.argmax())] for r in links]
    pos = [r.num_tokens for r in links]
    step = 0
    while any(len(o) < n for o in out):
        rows = [b for b in range(len(texts)) if starts[b] <= step and len(out[b]) < n]
        if rows:
            logits = batched_decode_step(lm, [links[b].cache for b in rows], [out[b][-1] for b in rows],
                                         [pos[b] for b in rows])
            for b, row in zip(rows, logits):
                out[b].append(int(row.argmax()))
                pos[b] += 1
        step += 1
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gemma"])
def test_batched_greedy_equals_alone(kind):
    extra = {"sliding_window": 24} if kind == "mistral" else {}
    lm = tiny_lm(kind, **extra)
    assert supports_batching(lm)
    n = 12
    want = [alone(lm, t, n) for t in PROMPTS]
    # eos may end an alone decode early: compare the prefix it produced
    got = batched(lm, PROMPTS, n, starts=[0, 3, 5])
    for w, g in zip(want, got):
        assert g[:len(w)] == w


def test_batched_logits_match_single_step():
    lm = tiny_lm("llama")
    links = [link(lm, [text_segment(lm.tokenizer, t)], "full", extra_capacity=2) for t in PROMPTS]
    toks = [int(r.logits.argmax()) for r in links]
    both = batched_decode_step(lm, [r.cache for r in links], toks, [r.num_tokens for r in links])
    for i, r in enumerate(links):
        again = link(lm, [text_segment(lm.tokenizer, PROMPTS[i])], "full", extra_capacity=2)
        one = batched_decode_step(lm, [again.cache], [toks[i]], [again.num_tokens])
        torch.testing.assert_close(both[i], one[0], atol=1e-4, rtol=1e-4)


def test_batched_step_refuses_a_model_off_ragpic_attention():
    """The generic batched forward (gemma: no lean step) needs ragpic's attention to read its plan;
    one request at a time decodes on any attention."""
    lm = tiny_lm("gemma", banded=False)
    res = [link(lm, [text_segment(lm.tokenizer, p)], "full", extra_capacity=2) for p in PROMPTS[:2]]
    assert not supports_batching(lm) and not runner_for(lm).batches
    with pytest.raises(ValueError, match="ragpic's attention"):
        batched_decode_step(lm, [r.cache for r in res], [1, 1], [r.num_tokens for r in res])
    assert batched_decode_step(lm, [res[0].cache], [1], [res[0].num_tokens]).shape[0] == 1


def test_batched_cache_checks_positions():
    lm = tiny_lm("llama")
    res = link(lm, [text_segment(lm.tokenizer, PROMPTS[0])], "full", extra_capacity=1)
    with pytest.raises(ValueError, match="past a linked cache"):
        BatchedCache([res.cache], [res.cache.capacity])


def test_scheduler_step_falls_back_when_attention_ignores_the_batch(monkeypatch):
    """A model whose attention does not honour its batched plan is stepped one request at a
    time, with the same ids (``step`` says so, and the scheduler stops batching)."""
    from ragpic import Config, RagPic
    from ragpic.core.ops.linked_cache import SlabPool
    from ragpic.errors import BatchNotHonoured
    from ragpic.serve import running
    from ragpic.serve.job import GenJob

    engine = RagPic(Config(store=None, device="cpu"), lm=tiny_lm("llama"))
    want = [engine.generate(p, chat=False, max_new_tokens=6).token_ids for p in PROMPTS[:2]]

    runner = runner_for(engine.lm)
    real = runner.decode

    def ignored(ids, positions, caches, **kwargs):
        if len(caches) > 1:
            raise BatchNotHonoured("attention ignored the plan")
        return real(ids, positions, caches, **kwargs)

    monkeypatch.setattr(runner, "decode", ignored)
    pool = SlabPool(max_idle=2)
    with torch.inference_mode():  # as on the scheduler thread
        runs = [running.admit(engine, GenJob(messages=None, prompt=p, sampling={"max_new_tokens": 6}), pool, 1000)
                for p in PROMPTS[:2]]
        assert running.step(engine, runs) is False  # told: the batch was not honoured
        while not all(r.done for r in runs):
            running.step(engine, [r for r in runs if not r.done], batch=False)
    assert [r.result.token_ids for r in runs] == want


class _Events:
    """Stands in for a handler's loop and queue: records every event a job is sent, in order."""

    def __init__(self, log: list, name: str, steps):
        self.log, self.name, self.steps = log, name, steps

    def call_soon_threadsafe(self, fn, item):
        fn(item)

    def put_nowait(self, item):  # on the scheduler thread: the step count is the one it acts on
        kind = type(item).__name__.lower()  # Linked, Delta, Done, Failed
        payload = getattr(item, "generation", None) or getattr(item, "text", None) or getattr(item, "error", None)
        self.log.append((self.name, kind, payload, self.steps()))


def _job(log: list, name: str, prompt: str, method: str, n: int, steps):
    from ragpic.serve.job import GenJob

    job = GenJob(messages=None, prompt=prompt, sampling={"max_new_tokens": n}, method=method)
    job.loop = job.events = _Events(log, name, steps)
    return job


@pytest.mark.parametrize("piece", [16, None])
def test_a_full_link_runs_in_pieces_between_the_running_streams_steps(piece):
    """While a new request's ``full`` link runs in pieces of ``piece`` rows, the running stream
    takes a decode step after each piece (without pieces: none during the link); both answers
    stay greedy-equal to running each request alone."""
    import time as _time

    from ragpic import Config, RagPic
    from ragpic.serve.scheduler import Scheduler, wait_idle

    engine = RagPic(Config(store=None, device="cpu", method="full"), lm=tiny_lm("llama"))
    long_prompt = " ".join(PROMPTS * 3)
    want_a = engine.generate(PROMPTS[0], chat=False, max_new_tokens=60).token_ids
    want_b = engine.generate(long_prompt, chat=False, max_new_tokens=4).token_ids
    assert len(want_a) == 60  # a stream that outlives the other request's link
    sched = Scheduler(engine, max_batch=4, link_piece=piece).start()
    try:
        log: list = []
        steps = lambda: sched.metrics.count("decode_steps")  # noqa: E731
        sched.submit(_job(log, "a", PROMPTS[0], "full", 60, steps))
        deadline = _time.monotonic() + 30
        while not any(e[:2] == ("a", "linked") for e in log) and _time.monotonic() < deadline:
            _time.sleep(0.001)
        submitted = steps()
        sched.submit(_job(log, "b", long_prompt, "full", 4, steps))
        assert wait_idle(sched, 60)
    finally:
        sched.stop()
    linked = {e[0]: e[3] for e in log if e[1] == "linked"}
    steps_during_b = linked["b"] - submitted  # a's steps while b was linked
    n_b = len(engine.lm.tokenizer(long_prompt, add_special_tokens=False)["input_ids"])
    if piece is None:
        # one whole link while a decoded, a's steps around it only: a decodes while b is being
        # matched (off the model thread), so the steps since the submit are not the measure
        assert sched.metrics.count("pieces", kind="link", decoding="yes") == 1
        assert sched.metrics.peak("link_piece_rows_max") == n_b
        assert sched.metrics.peak("pieces_between_decode_steps_max") == 1
    else:
        assert steps_during_b >= -(-n_b // piece) - 2  # one step per piece (but the last)
    done = {e[0]: e[2] for e in log if e[1] == "done"}
    assert done["a"].token_ids == want_a and done["b"].token_ids == want_b


@pytest.mark.parametrize("recipe_method", ["legolink-16", "legolink-0"])
def test_a_compile_in_pieces_gives_the_kv_of_one_compile(recipe_method):
    """A compile cut into pieces of at most 16 rows (short chunks together, a long chunk in
    parts over one appending cache) gives each chunk the KV of ``compile_chunks``, its dummy
    rows dropped; the pieces come out whole, in order, and no piece exceeds 16 rows."""
    from ragpic.core.compile import compile_chunks
    from ragpic.core.methods import parse_method
    from ragpic.cache.store import ChunkStore
    from ragpic.engine.compile_pipeline import ChunkJob
    from ragpic.engine.compiling import CompileWork, store_pieces

    lm = tiny_lm("llama")
    texts = ["a needle", "hides in the", PROMPTS[2], PROMPTS[0]]  # two short, two longer than 16 rows
    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    method = parse_method(recipe_method)
    store = ChunkStore(None, fingerprint=lm.fingerprint)
    work = CompileWork([ChunkJob(x, f"texts[{i}]", f"k{i}", t) for i, (t, x) in enumerate(zip(texts, ids))],
                       method, 16, store)
    rows = []
    with torch.inference_mode():
        while work.pieces_left:
            rows.append(work.run_piece(lm))
        want = compile_chunks(lm, ids, recipe=method.recipe)
    got = store_pieces(work)
    assert max(rows) <= 16 and sum(rows) == sum(work.lengths) and len(rows) > len(texts) - 1
    assert list(got) == ["k0", "k1", "k2", "k3"] and sorted(store.texts()) == ["k0", "k1", "k2", "k3"]
    for i, w in enumerate(want):
        kv = got[f"k{i}"]
        assert kv.base_position == w.base_position and kv.recipe == w.recipe
        assert torch.equal(kv.token_ids, w.token_ids)
        torch.testing.assert_close(kv.keys, w.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.values, w.values, atol=1e-5, rtol=1e-5)


def test_a_compiles_tensor_work_stays_on_the_scheduler_thread():
    """A compile's encode for the store (int8 quantizing: tensor work) runs on the scheduler
    thread and only the write on the requester's: any other thread that ran an OpenMP region
    would get a thread team of its own and slow every forward (docs/ARCHITECTURE.md §4). The
    compile returns each chunk as a read of its entry returns it (int8 KV, its scales)."""
    import threading

    from ragpic import Config, RagPic
    from ragpic.core.methods import parse_method
    from ragpic.engine.compiling import tokenized
    from ragpic.serve.scheduler import Scheduler

    engine = RagPic(Config(store=None, device="cpu", kv_quant="int8"), lm=tiny_lm("llama"))
    store, method, seen = engine.store, parse_method("legolink-16"), []

    def recorded(name, fn):
        def call(*args, **kwargs):
            seen.append((name, threading.current_thread().name))
            return fn(*args, **kwargs)
        return call

    store.encode_many, store.write = recorded("encode", store.encode_many), recorded("write", store.write)
    keys = [engine.chunk_key(t, method) for t in PROMPTS[:3]]
    sched = Scheduler(engine, link_piece=16).start()
    try:
        got = sched.compile(tokenized(engine, list(zip(keys, PROMPTS[:3]))), method)
    finally:
        sched.stop()
    assert {t for what, t in seen if what == "encode"} == {"ragpic-scheduler"}
    assert {t for what, t in seen if what == "write"} == {threading.current_thread().name}
    assert list(got) == keys and all(kv.keys.dtype == torch.int8 and kv.key_scales is not None for kv in got.values())
    assert store.get_many(keys).keys() == set(keys)
