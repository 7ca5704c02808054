"""Demo on the embedded defaults: a conversation that survives a restart.

Run with ``make demo`` (or ``python examples/demo.py``). No server, no network and
no LLM: a scripted chat model stands in for one. Everything is stored under
``$TIERED_MEMORY_HOME`` (default ``./.tiered_memory``).

The first process talks for five turns with a window of two turns; the second
process, started afresh, shows the same window and pages through the archive.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
import warnings

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory

warnings.filterwarnings("ignore", category=DeprecationWarning)

QUESTIONS = [
    "What does the AR table ar_invoice hold?",
    "应付账款表 ap_bill 有哪些字段?",
    "Which invoices are overdue?",
    "Join them with the customer table.",
    "Summarise what we found.",
]
ANSWERS = [
    "ar_invoice holds invoice_no, customer_id, amount, due_date and status.",
    "ap_bill 有 bill_no, vendor_id, amount, due_date 和 paid_at。",
    "Those with status = 'open' and due_date < today.",
    "JOIN customer c ON c.id = ar_invoice.customer_id.",
    "AR lives in ar_invoice, AP in ap_bill; overdue = open and past due.",
]


def history_for(session_id: str) -> TieredChatMessageHistory:
    return TieredChatMessageHistory(session_id, user_id="demo-user", window_turns=2)


def talk(session_id: str) -> None:
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are an ERP assistant."),
            MessagesPlaceholder("history"),
            ("human", "{input}"),
        ]
    )
    chat = RunnableWithMessageHistory(
        prompt | FakeListChatModel(responses=ANSWERS),
        history_for,
        input_messages_key="input",
        history_messages_key="history",
    )
    print(f"== process 1: five turns in session {session_id} (window: 2 turns)")
    for question in QUESTIONS:
        answer = chat.invoke({"input": question}, {"configurable": {"session_id": session_id}})
        print(f"  user: {question}\n  bot:  {answer.content}")


def after_restart(session_id: str) -> None:
    print("\n== process 2, started afresh: the window is restored from the archive")
    history = history_for(session_id)
    for message in history.messages:
        print(f"  [{message.type}] {message.content}")
    backup: MySQLBackup = history.backup
    print(f"\n== the archive ({backup!r}) keeps every message; newest page of 4:")
    page = backup.history(session_id, limit=4)
    for row in page:
        print(f"  #{row.id} {row.created_at:%H:%M:%S.%f} {row.role:>5}: {row.message.content}")
    older = backup.history(session_id, before_id=page[0].id, limit=50)
    print(f"  ... and {len(older)} older messages before #{page[0].id}")
    sessions = backup.sessions(user_id="demo-user")
    print(
        f"\n== sessions of demo-user: {len(sessions)}; this one has "
        f"{next(s.message_count for s in sessions if s.session_id == session_id)} messages"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"talk": talk, "restart": after_restart}[sys.argv[1]](sys.argv[2])
    else:
        session = f"demo-{uuid.uuid4().hex[:8]}"
        for step in ("talk", "restart"):
            subprocess.run([sys.executable, __file__, step, session], check=True)
