"""Repair the chosen runs in the deeper layers only, from the hidden state each chunk had at compile.

``qr``'s second pass forwards every chosen run through every layer. A compiled chunk's KV moves
least in the first layers (CacheBlend's KV deviation grows with depth), so a run could start at
layer ``L0`` from the hidden state its chunk had there when it was compiled alone, and be
recomputed, now seeing the chunks before it, only in layers ``L0..L-1``: ``(L - L0) / L`` of a
row's cost, so ``1 / (1 - L0/L)`` times the budget at the same cost. The question and the text
between the runs still go through every layer. Below ``L0`` the runs keep their compiled KV.
Storing the hidden state at one layer costs ``hidden`` values a token beside the KV's
``2 * L * kv_heads * head_dim`` (on Qwen2.5-1.5B: 1,536 against 14,336, +11%).

Each recipe is a ``qr`` method with ``@<L0 fraction>`` (``qr-8-k4-h1-w-t4@0.5`` starts the runs at
half depth; no suffix: ``qr`` as the engine runs it). Every recipe links the same prompt side by
side with ``full`` (whose answer teacher-forces the others), as ``ragpic eval ruler`` does; the
hidden states are taken by a plain forward of each chunk at its compile positions (not timed).

    python benchmarks/late_start.py GGUF [--tasks niah_multivalue,vt] [--samples 8] [--seed 0] \\
        [--recipes qr-4-k4-h1-w-t4,qr-8-k4-h1-w-t4@0.5] [--json OUT]

(RULER prompts at 4k; bf16, held dense weights, 2 threads, the prefix cache as the engine's.)
One line per prompt and recipe, then per task and recipe: the mean score over ``full``'s and
the median link speed-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragpic.core.forward import step_inputs
from ragpic.core.runner import runner_for
from ragpic.core.link.query_guided import QueryGuided
from ragpic.core.methods import parse_method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.segments import Segment, segment_starts
from side_by_side import load, recipe_parser, report, side_by_side


class LateStart(QueryGuided):
    """``qr`` whose second pass starts the chosen runs at layer ``from_layer`` from kept hidden states.

    ``hidden``: chunk token ids -> ``(T, hidden)`` states at the input of layer ``from_layer``,
    the chunk compiled alone (positions from 0)."""

    def __init__(self, method, from_layer: int, hidden: dict[tuple[int, ...], torch.Tensor]):
        super().__init__(method)
        self.from_layer, self.hidden = from_layer, hidden

    @property
    def name(self) -> str:
        return f"{self.method.name}@L{self.from_layer}"

    def second_pass(self, lm: LoadedModel, segments: Sequence[Segment], cache: LinkedCache, ids: torch.Tensor,
                    rows: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        runner, n, dev = runner_for(lm), ids.numel(), lm.device
        kept = torch.zeros(n, lm.model.config.hidden_size, dtype=lm.dtype)
        for seg, start in zip(segments, segment_starts(segments)):
            if seg.is_chunk and start > 0:
                kept[start:start + seg.num_tokens] = self.hidden[tuple(seg.token_ids.tolist())]
        late = chosen[rows]  # (R,) the rows that start at from_layer
        text = rows[~late]
        # layers 0..L0-1: the text rows only; the runs keep their compiled KV there
        step = step_inputs(lm, to_device(text, dev), n, host_positions=text)
        h, rotary = runner.embed(to_device(ids[text], dev), step.rows)
        h = runner.layers(h, rotary, cache, step, 0, self.from_layer)
        # layers L0..: every row, the runs from their compiled hidden state
        merged = to_device(kept[rows], dev)[None].clone()
        merged[:, to_device(~late, dev)] = h
        step = step_inputs(lm, to_device(rows, dev), n, host_positions=rows)
        rotary = runner.rotary(merged, step.rows)
        merged = runner.layers(merged, rotary, cache, step, self.from_layer, lm.num_layers)
        cache.length = n
        return runner.logits(merged[0, -1])


def hidden_at(lm: LoadedModel, chunk_ids: Sequence[Sequence[int]], layers: set[int]) -> dict[int, dict]:
    """``layer -> {chunk ids -> (T, hidden)}``: each chunk forwarded alone at positions ``0..T-1``."""
    out: dict[int, dict] = {layer: {} for layer in layers}
    with torch.inference_mode():
        for ids in chunk_ids:
            x = torch.tensor(ids, device=lm.device)[None]
            hs = lm.model(input_ids=x, position_ids=torch.arange(len(ids), device=lm.device)[None],
                          output_hidden_states=True, use_cache=False).hidden_states
            for layer in layers:
                out[layer][tuple(ids)] = hs[layer][0].to("cpu", lm.dtype)
    return out


def main() -> None:
    p = recipe_parser(__doc__, "qr-4-k4-h1-w-t4,qr-8-k4-h1-w-t4@0.5",
                      "comma list: a qr method, with @<fraction of the layers> to start its runs there")
    args = p.parse_args()
    lm = load(args.gguf)
    recipes = [(r, *r.partition("@")[::2]) for r in args.recipes.split(",")]
    starts = {r: round(float(frac) * lm.num_layers) if frac else None for r, _, frac in recipes}
    memo: dict[tuple, dict] = {}

    def linker_of(name: str, method: str, chunks: list[list[int]]):
        if starts[name] is None:
            return None
        key = tuple(map(tuple, chunks))
        if key not in memo:  # one plain forward per prompt, for every layer a recipe starts at
            memo.clear()
            memo[key] = hidden_at(lm, chunks, {v for v in starts.values() if v is not None})
        return LateStart(parse_method(method), starts[name], memo[key][starts[name]])

    tasks = args.tasks.split(",")
    records = side_by_side(lm, tasks, args.samples, args.seed, args.length, [(r, m) for r, m, _ in recipes],
                           linker_of)
    report(records, tasks, [r for r, _, _ in recipes], args)


if __name__ == "__main__":
    main()
