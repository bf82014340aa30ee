"""A small LangGraph graph that pauses for a human answer (`interrupt()`), for the tests."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt


class ApprovalState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    steps: Annotated[list[str], operator.add]
    decision: str
    total: int


def draft(state: ApprovalState) -> dict[str, Any]:
    request = state["messages"][-1].content
    return {
        "messages": [AIMessage(content=f"draft reply to {request!r}", id="draft")],
        "steps": ["draft"],
        "total": 100,
    }


def approve(state: ApprovalState) -> dict[str, Any]:
    answer = interrupt({"question": "send this reply?", "draft": state["messages"][-1].content})
    return {"decision": str(answer), "steps": ["approve"]}


def send(state: ApprovalState) -> dict[str, Any]:
    if state["decision"] != "yes":
        return {"steps": ["dropped"]}
    return {
        "messages": [AIMessage(content="sent", id="sent")],
        "steps": ["send"],
        "total": state["total"] + 1,
    }


def approval_graph() -> StateGraph[ApprovalState]:
    """draft -> approve (interrupts for a human answer) -> send."""
    graph = StateGraph(ApprovalState)
    graph.add_node("draft", draft)
    graph.add_node("approve", approve)
    graph.add_node("send", send)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "approve")
    graph.add_edge("approve", "send")
    graph.add_edge("send", END)
    return graph


def request(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text, id="request")]}


def reply_chat(saver: BaseCheckpointSaver[Any], state: Any, reply_id: str) -> Any:
    """A chat of one node on `state` (a `messages` channel of any kind): each turn adds a
    reply whose id is `reply_id` followed by the count of messages it answered."""

    # `Any`: LangGraph would take an annotated state as the node's input schema.
    def reply(current: Any) -> dict[str, Any]:
        count = len(current["messages"])
        return {"messages": [AIMessage(f"reply to {count}", id=f"{reply_id}{count}")]}

    graph = StateGraph(state)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    return graph.compile(checkpointer=saver)
