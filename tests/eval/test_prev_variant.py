"""The evaluations' ``@prev<m>`` and ``@head`` variants (docs/ARCHITECTURE.md §1.3): each chunk compiled
behind the m chunks before it in the prompt, or behind the prompt's leading text, measured side by
side with the chunks compiled alone."""

from __future__ import annotations

import json

import pytest
import torch

from ragpic.errors import ConfigError
from ragpic.eval.variants import compile_for, normalize_methods, variant_key
from tiny import tiny_lm


def test_compile_for_compiles_each_chunk_behind_the_ones_before():
    lm = tiny_lm("llama", num_hidden_layers=2)
    ids = [[5, 6, 7], [8, 9], [10, 11, 12], [5, 6, 7]]
    methods = normalize_methods("naive,naive@prev1,legolink-16@prev2@int8")
    assert methods == ["full", "naive", "naive@prev1", "legolink-16@prev2@int8"]
    assert [variant_key(m) for m in methods] == ["plain", "plain", "plain@prev1", "plain@prev2@int8"]
    memo: dict = {}
    kvs = compile_for(lm, ids, methods, memo)
    assert set(kvs) == {"plain", "plain@prev1", "plain@prev2", "plain@prev2@int8"}
    assert [kv.base_position for kv in kvs["plain"]] == [0, 0, 0, 0]
    assert [kv.base_position for kv in kvs["plain@prev1"]] == [0, 3, 2, 3]
    assert [kv.base_position for kv in kvs["plain@prev2"]] == [0, 3, 5, 5]
    # the repeated chunk behind other chunks is another entry; alone it is the same one
    assert kvs["plain"][0] is kvs["plain"][3] and kvs["plain@prev1"][0] is not kvs["plain@prev1"][3]
    assert all(kv.quant_dtype is not None for kv in kvs["plain@prev2@int8"][1:])
    again = compile_for(lm, ids, ["naive@prev1"], memo)  # the memo serves a second prompt of the same chunks
    assert all(a is b for a, b in zip(again["plain@prev1"], kvs["plain@prev1"]))


def test_compile_for_puts_the_leading_text_before_every_chunk():
    lm = tiny_lm("llama", num_hidden_layers=2)
    ids = [[5, 6, 7], [8, 9], [10, 11, 12]]
    methods = normalize_methods("naive@head,naive@head@prev1,naive@head1@prev1,naive@chat")
    assert [variant_key(m) for m in methods] == ["plain", "plain@head", "plain@head@prev1", "plain@head1@prev1",
                                                 "plain@chat"]
    kvs = compile_for(lm, ids, methods, {}, head=[3, 4, 13], opening=2)
    assert [kv.base_position for kv in kvs["plain@chat"]] == [2, 2, 2]  # the opening: the first two ids
    assert [kv.base_position for kv in kvs["plain@head"]] == [3, 3, 3]
    assert [kv.base_position for kv in kvs["plain@head@prev1"]] == [3, 6, 5]
    assert [kv.base_position for kv in kvs["plain@head1@prev1"]] == [1, 4, 3]  # the leading text's first id only
    # the first chunk reads the leading text alone either way; the others read other text. The two
    # first chunks come from forwards of different batch shapes, so they agree to rounding (CPUs
    # differ in the last bits: the exactness tests' fp32 bound), not bit for bit
    torch.testing.assert_close(kvs["plain@head"][0].keys, kvs["plain@head@prev1"][0].keys, rtol=0, atol=1e-5)
    assert kvs["plain@head"][0].recipe != "plain"
    assert (kvs["plain@head"][1].keys - kvs["plain@head@prev1"][1].keys).abs().max() > 1e-2
    with pytest.raises(ConfigError, match="no leading text"):
        compile_for(lm, ids, ["naive@head"])
    with pytest.raises(ConfigError, match="drop '@chat'"):
        compile_for(lm, ids, ["naive@chat"], head=[3, 4])  # no opening in this prompt


def test_the_qa_evaluation_refuses_it_its_passages_are_not_one_document(tmp_path):
    from ragpic.eval.evaluate import evaluate_qa

    with pytest.raises(ConfigError, match="separate articles"):
        evaluate_qa(tiny_lm("llama", num_hidden_layers=2), [], ["naive@prev2"])


def test_cli_ruler_runs_it_beside_the_chunks_alone(tmp_path, capsys):
    from tiny import saved_tiny_model

    from ragpic.cli import main

    model_dir = saved_tiny_model(tmp_path / "tiny-model")
    out = tmp_path / "ruler.json"
    rc = main(["eval", "ruler", "--model", str(model_dir), "--device", "cpu", "--tasks", "niah_single",
               "--lengths", "700", "--samples", "1", "--chunk-tokens", "128",
               "--methods", "naive,naive@prev8,naive@head@prev8,naive@chat@prev8",
               "--max-new-tokens", "3", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(out.read_text())["samples"][0]
    naive, behind = rec["methods"]["naive"], rec["methods"]["naive@prev8"]
    assert rec["chunks"] > 2 and behind["recomputed_tokens"] == naive["recomputed_tokens"]  # the same rows linked
    # chunks that read the chunks before them are nearer full than chunks compiled alone
    assert behind["tf_kl_vs_full"] < naive["tf_kl_vs_full"]
    # behind the leading text and every chunk before it, each chunk's KV is full's: only rounding is left
    exact = rec["methods"]["naive@head@prev8"]
    assert exact["answer"] == rec["methods"]["full"]["answer"] and exact["tf_kl_vs_full"] < 1e-5
    # behind the chat opening only, the instruction after it is not read: not full's KV
    chat = rec["methods"]["naive@chat@prev8"]
    assert chat["recomputed_tokens"] == naive["recomputed_tokens"] and chat["tf_kl_vs_full"] > exact["tf_kl_vs_full"]
    capsys.readouterr()
    assert main(["eval", "ruler", "--methods", "legolink-0@prev2"]) == 2
    assert "drop '@prev2'" in capsys.readouterr().err
