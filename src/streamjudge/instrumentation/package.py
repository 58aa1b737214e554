"""The libraries streamjudge's instrumentor instruments and the versions it supports.

Any one of them is enough: a LangGraph app without FastAPI still gets node spans and a judged answer
stream; a FastAPI app whose tokens do not come from LangGraph still gets its bodies watched. The ranges
are the oldest versions the compatibility matrix runs (docs/compatibility.md).
"""

_instruments: tuple[str, ...] = ()
_instruments_any: tuple[str, ...] = (
    "langchain-core >= 0.3",
    "starlette >= 0.36.3",
)
