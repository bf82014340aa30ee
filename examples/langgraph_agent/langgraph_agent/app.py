"""The agent: a LangGraph graph registered on a `Workflows` app that the workers load
(`agboss-sql worker --app langgraph_agent.app:app`).

    START -> model -> tools -> model -> approval -> tools -> model -> END
                                     (interrupt)  (charge)

`model` stands in for an LLM (a scripted one, so the example needs no API key): it asks
for a quote of the order, then to charge the total, then answers. A charge waits for a
human's approval: `approval` calls `interrupt()`, the thread pauses holding no lease, and
`python -m langgraph_agent.client approve ID` (from any machine) resumes it on whichever
worker takes it. The `charge` tool writes its row with `node_effect`, in the fence's
transaction and keyed by LangGraph's task id: a worker killed after the charge and before
the checkpoint leaves the thread to another worker, which runs the step again and gets the
stored charge instead of charging twice.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from agboss_sql.runtime import Workflows
from agboss_sql.runtime.graphs import add_graph, current_lease, node_effect
from langgraph_agent.schema import charges

RECEIPT_MS = int(os.environ.get("AGENT_RECEIPT_MS", "0"))
"""How long the payment provider takes to send its receipt after a charge (the tests make
it long enough to kill a worker in the middle of the `tools` step)."""

PRICES = {"book": 1200, "pen": 300, "lamp": 4500}


class Agent(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    items: list[str]


def model(state: Agent) -> dict[str, Any]:
    """What an LLM would decide from the conversation so far (scripted)."""
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"name": "quote", "args": {"items": state["items"]}, "id": "call-quote"}
        return {"messages": [AIMessage("Let me price that.", tool_calls=[call])]}
    if isinstance(last, ToolMessage) and last.name == "quote":
        cents = int(last.content)  # type: ignore[arg-type]
        call = {"name": "charge", "args": {"cents": cents}, "id": "call-charge"}
        return {"messages": [AIMessage(f"That is {cents} cents.", tool_calls=[call])]}
    if isinstance(last, ToolMessage) and last.name == "charge" and last.status == "success":
        return {"messages": [AIMessage(f"Done: {last.content}.")]}
    return {"messages": [AIMessage("Nothing was charged.")]}


def route(state: Agent) -> str:
    last = state["messages"][-1]
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return END
    return "approval" if last.tool_calls[0]["name"] == "charge" else "tools"


def approval(state: Agent) -> dict[str, Any]:
    """A human approves the charge: the thread pauses until someone answers."""
    call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
    decision = interrupt({"charge_cents": call["args"]["cents"]})
    if isinstance(decision, dict) and decision.get("approved"):
        return {}
    declined = ToolMessage(
        "declined by a human", name="charge", tool_call_id=call["id"], status="error"
    )
    return {"messages": [declined]}


def after_approval(state: Agent) -> str:
    return "model" if isinstance(state["messages"][-1], ToolMessage) else "tools"


async def charge_card(tx: Any, thread_id: str, cents: int) -> dict[str, Any]:
    """The business write: one charge row, committed with the fence (or not at all)."""
    by = current_lease().holder_instance_id
    await tx.execute(charges.insert().values(thread_id=thread_id, cents=cents, charged_by=by))
    return {"charged": cents, "by": by}


async def tools(state: Agent) -> dict[str, Any]:
    """Run the tool calls of the model's last message."""
    results: list[ToolMessage] = []
    for call in state["messages"][-1].tool_calls:  # type: ignore[union-attr]
        if call["name"] == "quote":
            cents = sum(PRICES.get(item, 100) for item in call["args"]["items"])
            results.append(ToolMessage(str(cents), name="quote", tool_call_id=call["id"]))
        else:
            thread_id = current_lease().execution_id
            charged = await node_effect("charge", charge_card, thread_id, call["args"]["cents"])
            await asyncio.sleep(RECEIPT_MS / 1000)  # the provider's receipt
            text = f"charged {charged['charged']} cents"
            results.append(ToolMessage(text, name="charge", tool_call_id=call["id"]))
    return {"messages": results}


graph = StateGraph(Agent)
graph.add_node("model", model)
graph.add_node("tools", tools)
graph.add_node("approval", approval)
graph.add_edge(START, "model")
graph.add_conditional_edges("model", route, ["tools", "approval", END])
graph.add_conditional_edges("approval", after_approval, ["tools", "model"])
graph.add_edge("tools", "model")

app = Workflows("langgraph-agent")
add_graph(app, "agent", graph, output=lambda values: values["messages"][-1].content)
