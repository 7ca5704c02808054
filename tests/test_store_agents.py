"""TieredStore as an agent's store: ``create_agent(..., store=...)`` and LangMem's memory tools.

A fake tool-calling chat model drives real tools: one that reads and writes
``runtime.store``, and LangMem's ``manage_memory``/``search_memory`` (which find the
store with ``get_store()``). The memories land in the archive database and a later
agent on the same database finds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.store.base import InvalidNamespaceError

from langchain_tiered_memory import MySQLBackup, TieredStore

from .conftest import require_module

langmem = require_module("langmem", "agents")  # in the agents and dev extras


class ToolScript(GenericFakeChatModel):
    """Scripted replies, tool calls included; binding tools changes nothing."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolScript:
        return self


def script(*replies: AIMessage | str) -> ToolScript:
    return ToolScript(messages=iter([AIMessage(r) if isinstance(r, str) else r for r in replies]))


def calls(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])


@tool
def remember(fact: str, runtime: ToolRuntime) -> str:
    """Save a fact about the user."""
    assert runtime.store is not None
    user = runtime.config["configurable"]["user_id"]
    key = f"fact-{len(runtime.store.search(('facts', user), limit=100))}"
    runtime.store.put(("facts", user), key, {"text": fact})
    return f"saved {key}"


@tool
def recall(query: str, runtime: ToolRuntime) -> str:
    """Look up saved facts about the user."""
    assert runtime.store is not None
    user = runtime.config["configurable"]["user_id"]
    hits = runtime.store.search(("facts", user), query=query, limit=1)
    return hits[0].value["text"] if hits else "nothing"


@pytest.fixture
def store(backup: MySQLBackup) -> Iterator[TieredStore]:
    tiered = TieredStore(backup)
    yield tiered
    tiered.metadata.drop_all(backup.engine)


def tool_outputs(result: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)]


def user(user_id: str) -> dict[str, Any]:
    return {"configurable": {"user_id": user_id, "langgraph_user_id": user_id}}


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def test_an_agent_reads_and_writes_its_store(store: TieredStore) -> None:
    writer = create_agent(
        script(calls("remember", "c1", fact="我喜欢乌龙茶"), "Noted."),
        [remember, recall],
        store=store,
    )
    writer.invoke(ask("记住：我喜欢乌龙茶"), user("u1"))

    assert store.get(("facts", "u1"), "fact-0").value == {"text": "我喜欢乌龙茶"}  # type: ignore[union-attr]
    # A new agent (another process, as far as it knows) on the same database.
    reader = create_agent(
        script(calls("recall", "c2", query="乌龙茶"), "You like oolong tea."),
        [remember, recall],
        store=TieredStore(store.backup),
    )
    result = reader.invoke(ask("我喜欢喝什么?"), user("u1"))
    assert tool_outputs(result) == ["我喜欢乌龙茶"]
    # Another user's namespace is another user's.
    other = create_agent(
        script(calls("recall", "c3", query="乌龙茶"), "I don't know."), [recall], store=store
    )
    assert tool_outputs(other.invoke(ask("?"), user("u2"))) == ["nothing"]


async def test_an_async_agent_uses_the_store_through_abatch(store: TieredStore) -> None:
    agent = create_agent(
        script(
            calls("remember", "c1", fact="The ledger closes on the 5th"),
            calls("recall", "c2", query="ledger"),
            "It closes on the 5th.",
        ),
        [remember, recall],
        store=store,
    )
    try:
        result = await agent.ainvoke(ask("When does the ledger close?"), user("u1"))
    finally:
        await store.backup.adispose()

    assert tool_outputs(result) == ["saved fact-0", "The ledger closes on the 5th"]


def test_langmem_memory_tools_store_and_find_memories(store: TieredStore) -> None:
    namespace = ("memories", "{langgraph_user_id}")
    tools = [
        langmem.create_manage_memory_tool(namespace=namespace),
        langmem.create_search_memory_tool(namespace=namespace),
    ]
    agent = create_agent(
        script(
            calls("manage_memory", "c1", content="用户的猫叫 Miso", action="create"),
            calls("manage_memory", "c2", content="Prefers replies in Chinese", action="create"),
            calls("search_memory", "c3", query="猫"),
            "你的猫叫 Miso。",
        ),
        tools,
        store=store,
    )

    result = agent.invoke(ask("我的猫叫什么?"), user("u-42"))

    created, _, found = tool_outputs(result)
    assert created.startswith("created memory ")
    memories = store.search(("memories", "u-42"), limit=10)
    assert sorted(m.value["content"] for m in memories) == [
        "Prefers replies in Chinese",
        "用户的猫叫 Miso",
    ]
    hits = json.loads(found)
    assert hits[0]["value"]["content"] == "用户的猫叫 Miso"
    assert hits[0]["score"] is not None
    assert store.list_namespaces(prefix=("memories",)) == [("memories", "u-42")]


@pytest.mark.parametrize("user_id", ["u1.admin", "u1\x1b[31m", "x" * 600])
def test_an_untrusted_user_id_is_refused_with_a_typed_error(
    store: TieredStore, user_id: str
) -> None:
    # "." would split the namespace; a control character would reach logs; a
    # namespace longer than the index cannot be stored.
    tools = [langmem.create_manage_memory_tool(namespace=("memories", "{langgraph_user_id}"))]
    agent = create_agent(
        script(calls("manage_memory", "c1", content="x", action="create"), "ok"),
        tools,
        store=store,
    )

    with pytest.raises(InvalidNamespaceError):
        agent.invoke(ask("hi"), user(user_id))

    assert store.list_namespaces() == []
