"""The framework classes' one check of the engine they are given (both LlamaIndex's and LangChain's)."""

from __future__ import annotations

from ragpic.engine.engine import RagPic
from ragpic.errors import ConfigError

__all__ = ["check_engine"]


def check_engine(engine: object, owner: str) -> RagPic:
    """``engine`` if it is a :class:`RagPic`; else a :class:`ConfigError` naming ``owner``'s
    ``engine`` argument. Framework classes never load a model behind the caller's back."""
    if isinstance(engine, RagPic):
        return engine
    got = "nothing" if engine is None else f"a {type(engine).__name__}"
    raise ConfigError(
        f"{owner} needs engine=: a ragpic.RagPic (got {got}). Pass engine=RagPic() for the embedded "
        f"SmolLM2, or RagPic(Config(model=...)) for yours; share one engine between your LLM objects."
    )
