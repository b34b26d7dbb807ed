"""What the LangChain tests share: the embedding model, the RAG chain, a recorder of model calls.

Kept out of the test modules so a child process (the reload test) can import it cheaply.
"""

from __future__ import annotations

import time

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnablePassthrough

from ragpic.llm.langchain import ChatRagPic, RagPicLLM
from ragpic.retriever_hooks.langchain import messages_key, prompt_key

K = 3  # retrieved documents per question
NEW_TOKENS = 20
EXACT = "legolink-100000"  # recomputes every chunk token: must equal `full`

PROMPT = PromptTemplate.from_template(
    "Answer the question using the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")
CHAT_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using the context. Be brief."),
    ("human", "Context:\n{context}\n\nQuestion: {question}"),
])


class MiniLM(Embeddings):
    """all-MiniLM-L6-v2 from a local folder, through sentence-transformers."""

    def __init__(self, path: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device="cpu")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(list(texts), normalize_embeddings=True).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def rag_chain(retriever, llm, prompt=PROMPT):
    """The standard LCEL RAG chain."""
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


def model_for(rag: dict, kind: str):
    """The completion LLM (``kind="llm"``) or chat model over the shared engine, and its prompt."""
    cls, prompt = (RagPicLLM, PROMPT) if kind == "llm" else (ChatRagPic, CHAT_PROMPT)
    return cls(engine=rag["engine"]), prompt


def recorded_chain(rag: dict, kind: str):
    """``(llm, recorder, chain)``: the RAG chain with the hints handler and a recorder wired in."""
    llm, prompt = model_for(rag, kind)
    rec = Recorder()
    return llm, rec, rag_chain(rag["retriever"], llm, prompt).with_config(callbacks=[llm.hints, rec])


def passages(item: dict, words: int | None = 120) -> list[Document]:
    return [Document(page_content=f"{c['title']}\n{' '.join(c['text'].split()[:words])}",
                     metadata={"title": c["title"]}) for c in item["ctxs"]]


class Recorder(BaseCallbackHandler):
    """Collects each model call's ragpic stats, streamed tokens, and the hints it was given."""

    def __init__(self, hints=None):
        self.hints = hints
        self.infos: list[dict] = []
        self.tokens: list[str] = []
        self.hinted: list[list[str]] = []
        self.ended_at: list[float] = []
        self._prompts: dict = {}

    def on_llm_start(self, serialized, prompts, *, run_id, **kwargs):
        self._prompts[run_id] = prompt_key(prompts[0])

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs):
        self._prompts[run_id] = messages_key(messages[0])

    def on_llm_new_token(self, token, **kwargs):
        if token:
            self.tokens.append(token)

    def on_llm_end(self, response, *, run_id, **kwargs):
        gen = response.generations[0][0]
        info = gen.generation_info or getattr(getattr(gen, "message", None), "response_metadata", {})
        self.infos.append(dict(info))
        self.ended_at.append(time.perf_counter())
        if self.hints is not None and run_id in self._prompts:
            self.hinted.append(self.hints.texts_for(self._prompts.pop(run_id)))


def check_linked(rec: Recorder, n: int, hints: int = K) -> None:
    """``n`` model calls, each linking K stored chunks, given ``hints`` retrieved texts."""
    assert len(rec.infos) == n
    for info in rec.infos:
        assert info["chunks_matched"] == K and info["chunks_loaded"] == K, info
        assert info["chunks_compiled"] == 0, info
        assert info["hints"] == hints, info
