"""A LangGraph app with a *sync* answer node consumed by a sync loop: every action acts on what the node
receives, as it does for an async node (the model tap wraps ``_stream`` as well as ``_astream``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph

from _fakes import KeywordJudge
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeInstrumentor

GROUNDED = "The tower is 330 metres tall. It opened in 1889."
INVENTED = " It was HALLUCINATED by Napoleon."
CONTINUATION = " It is in Paris."


class ScriptedModel(BaseChatModel):
    """Writes GROUNDED + INVENTED word by word; asked to continue its answer, writes CONTINUATION."""

    @property
    def _llm_type(self) -> str:
        return "scripted-sync"

    def _reply(self, messages: list[BaseMessage]) -> str:
        return CONTINUATION if any(isinstance(m, AIMessage) for m in messages) else GROUNDED + INVENTED

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self._reply(messages)))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        text = self._reply(messages)
        words = text.split(" ")
        for i, w in enumerate(words):
            tok = w if i == len(words) - 1 else w + " "
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=tok))
            if run_manager is not None:
                run_manager.on_llm_new_token(tok, chunk=chunk)
            yield chunk


def _graph(call: str) -> Any:
    model = ScriptedModel()

    def generate(state: MessagesState) -> dict[str, list[BaseMessage]]:
        if call == "stream":
            text = "".join(str(c.content) for c in model.stream(state["messages"]))
            return {"messages": [AIMessage(content=text)]}
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("generate", generate)
    g.add_edge(START, "generate")
    g.add_edge("generate", END)
    return g.compile()


@pytest.mark.parametrize("call", ["stream", "invoke"])
@pytest.mark.parametrize(("action", "answer", "verdict"), [
    ("stop", None, "stopped"),
    ("regenerate", GROUNDED + CONTINUATION, "regenerated"),
])
def test_a_sync_node_gets_what_the_guard_released(harness, call: str, action: str, answer: str | None,  # type: ignore[no-untyped-def]
                                                  verdict: str) -> None:
    rt = harness.configure(KeywordJudge(), mode="hold_back", action=action, window_sentences=1,
                           end_wait_s=5.0, preflight=False)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        graph = _graph(call)
        with rt.tracer.start_as_current_span("request"):
            # a sync generator over graph.stream, as a sync FastAPI endpoint would run it
            out = list(graph.stream({"messages": [HumanMessage(content="How tall is the tower?")]},
                                    stream_mode="updates"))
    finally:
        inst.uninstrument()
    (update,) = out
    node_answer = str(update["generate"]["messages"][-1].content)
    assert "HALLUCINATED" not in node_answer
    if answer is None:  # stopped: the grounded sentences, then the fallback
        assert node_answer.startswith(GROUNDED + " ")
        assert node_answer != GROUNDED + INVENTED
    else:
        assert node_answer == answer
    stream = next(s for s in harness.spans() if s.name == semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_VERDICT] == verdict
    assert stream.attributes[semconv.STREAM_REGENERATIONS] == (1 if action == "regenerate" else 0)
