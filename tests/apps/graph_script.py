"""A script (or a worker) that runs the self-RAG graph with no web server and prints the answer."""

from __future__ import annotations

import asyncio
import json

from self_rag import build_graph


async def main() -> None:
    out = await build_graph().ainvoke({"question": "How tall is the Eiffel Tower?"})
    print(json.dumps({"generation": out["generation"], "documents": out["documents"]}))


if __name__ == "__main__":
    asyncio.run(main())
