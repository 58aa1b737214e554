"""What the app shapes share: the knowledge base, the app's chat model, and how they are served.

The apps know nothing about streamjudge. Their model is the real ``langchain-openai`` client pointed at
the scripted OpenAI-compatible server of the test (``APP_LLM_BASE_URL``).
"""

from __future__ import annotations

import os
import re

from langchain_openai import ChatOpenAI

DOCS: tuple[str, ...] = (
    "The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair.",
    "The Colosseum in Rome could hold about 50,000 spectators. It was completed in 80 AD.",
)


def search(query: str) -> list[str]:
    """The passages sharing a content word with the query (a keyword retriever)."""
    words = {w for w in re.findall(r"[a-z]+", query.lower()) if len(w) > 3}
    return [d for d in DOCS if words & set(re.findall(r"[a-z]+", d.lower()))]


def llm(**kwargs: object) -> ChatOpenAI:
    return ChatOpenAI(model="scripted-app", base_url=os.environ["APP_LLM_BASE_URL"], api_key="test",
                      temperature=0, max_retries=0, **kwargs)  # type: ignore[arg-type]


def port() -> int:
    return int(os.environ["APP_PORT"])
