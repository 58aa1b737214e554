"""An app that traces its graph with Langfuse's LangChain ``CallbackHandler`` (run under opentelemetry-instrument).

``python langfuse_callback_app.py with|without``: the example graph answers one question, with the
handler in the run's callbacks or without it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from langfuse import Langfuse
from langfuse.langchain import CallbackHandler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "adaptive_rag"))
import rag


async def main(with_handler: bool) -> None:
    client = Langfuse()
    graph = rag.build_graph()
    config = {"callbacks": [CallbackHandler()]} if with_handler else {}
    await graph.ainvoke({"question": "How tall is the Eiffel Tower?"}, config=config)  # type: ignore[arg-type]
    client.flush()
    client.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] == "with"))
