"""LangChain's own standard test suites (``langchain-tests``) on ``ChatRagPic``, with SmolLM2.

Capability flags say what ragpic does: no tool calling, structured output, JSON mode or
multimodal input (a 135M model has none of them); usage metadata with the prompt tokens
read from the KV store as ``cache_read``; no per-call model override (one engine runs one
model: another name is refused).
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_tests")

from langchain_core.messages import AIMessage  # noqa: E402
from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from ragpic import Config, RagPic  # noqa: E402
from ragpic.llm.langchain import ChatRagPic  # noqa: E402

pytestmark = pytest.mark.integration

PASSAGE = ("The Golden Gate Bridge is a suspension bridge spanning the Golden Gate strait, the one-mile-wide "
           "strait connecting San Francisco Bay and the Pacific Ocean. It opened in 1937.")
_SHARED: dict = {}


@pytest.fixture(autouse=True)
def _shared_engine(smol):
    """One engine over the session's SmolLM2 for every test of both suites (built once)."""
    if "engine" not in _SHARED:
        engine = RagPic(Config(store=None, max_new_tokens=16), lm=smol)
        engine.compile([PASSAGE])
        _SHARED["engine"] = engine
    return _SHARED["engine"]


class _RagPicFlags:
    @property
    def chat_model_class(self) -> type[ChatRagPic]:
        return ChatRagPic

    @property
    def chat_model_params(self) -> dict:
        return {"engine": _SHARED["engine"]}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine, one model: ChatRagPic(model=<another>) is refused

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        model = ChatRagPic(engine=_SHARED["engine"], max_tokens=8)
        prompt = f"Context:\n{PASSAGE}\n\nWhen did the bridge open?"
        if stream:
            full = None
            for chunk in model.stream(prompt):
                full = chunk if full is None else full + chunk
            msg = full
        else:
            msg = model.invoke(prompt)
        assert msg.usage_metadata["input_token_details"]["cache_read"] > 0  # the passage's KV was linked
        return msg


class TestChatRagPicUnit(_RagPicFlags, ChatModelUnitTests):
    pass


class TestChatRagPicIntegration(_RagPicFlags, ChatModelIntegrationTests):
    @property
    def chat_model_params(self) -> dict:
        # short answers keep the suite fast on a CPU (the unit suite checks max_tokens itself)
        return {"engine": _SHARED["engine"], "max_tokens": 16}
