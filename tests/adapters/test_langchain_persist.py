"""LangChain persistence: a FAISS folder saved by one process is linked by another, compiling nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_community")
pytest.importorskip("faiss")

from langchain_helpers import K, rag_chain  # noqa: E402

from ragpic.llm.langchain import RagPicLLM  # noqa: E402

pytestmark = pytest.mark.integration

RELOAD = """
import json, sys
sys.path.insert(0, {tests!r})
from langchain_core.callbacks import BaseCallbackHandler
from ragpic import Config, RagPic, kv_folder
from ragpic.llm.langchain import RagPicLLM
from ragpic.core.model import load_model
from ragpic.retriever_hooks.langchain import compile_vectorstore, load_faiss
from langchain_helpers import EXACT, K, NEW_TOKENS, MiniLM, Recorder, rag_chain

folder = {folder!r}
engine = RagPic(Config(store=kv_folder(folder), method=EXACT, max_new_tokens=NEW_TOKENS),
                lm=load_model(device="cpu"))
store = load_faiss(folder, MiniLM({embed!r}), engine)   # compiles whatever is missing
compiled = compile_vectorstore(store, engine, progress=False)
llm = RagPicLLM(engine=engine)
rec = Recorder()
chain = rag_chain(store.as_retriever(search_kwargs={{"k": K}}), llm).with_config(callbacks=[llm.hints, rec])
answer = chain.invoke({question!r})
s = engine.store.stats()
print("RESULT " + json.dumps({{"answer": answer, "compiled": compiled, "info": rec.infos[0],
      "misses": s.misses, "backend_hits": s.backend_hits, "puts": s.puts}}))
"""


def test_reload_in_fresh_process_compiles_nothing(rag, embed_model_path):
    q = rag["questions"][0]
    llm = RagPicLLM(engine=rag["engine"])
    expected = rag_chain(rag["retriever"], llm).with_config(callbacks=[llm.hints]).invoke(q)
    script = RELOAD.format(tests=str(Path(__file__).resolve().parents[1]), folder=str(rag["folder"]),
                           embed=embed_model_path, question=q)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    assert res["compiled"] == 0 and res["puts"] == 0, res
    assert res["misses"] == 0 and res["backend_hits"] == K, res
    assert res["info"]["chunks_loaded"] == K and res["info"]["chunks_compiled"] == 0, res
    assert res["info"]["hints"] == K, res
    assert res["answer"] == expected
