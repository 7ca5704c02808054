"""Find a real chat model when one is available, or stand in for one plainly.

Shared by the ``tiered-memory demo`` command and the notebooks: with
``OPENAI_API_KEY`` (and ``langchain-openai``) or a reachable Ollama (and
``langchain-ollama``) they use a real model; otherwise they say so and run with
:class:`ScriptedChatModel`.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

_QUESTION = re.compile(r"^## (?:User question|用户问题)\s*\n", re.MULTILINE)

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
#: The context the CLI runs an Ollama model with (``$TIERED_MEMORY_OLLAMA_NUM_CTX``):
#: the server's own default (2,048 or 4,096 tokens) cuts a longer prompt from its
#: start, silently. The extraction and consolidation budgets follow it.
DEFAULT_OLLAMA_NUM_CTX = 8192
DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"


def ollama_url(host: str | None = None) -> str:
    """Ollama's base URL from ``host`` or ``$OLLAMA_HOST`` (``host[:port]``, scheme optional)."""
    host = (host or os.environ.get("OLLAMA_HOST") or DEFAULT_OLLAMA_HOST).strip().rstrip("/")
    if "://" not in host:
        host = f"http://{host}"
    parts = urlsplit(host)
    if parts.port is None and parts.hostname:
        # Ollama's own convention: a bare host means its default port.
        host = f"{parts.scheme}://{parts.netloc}:11434{parts.path}"
    return host


def ollama_models(host: str | None = None, timeout: float = 0.5) -> list[str] | None:
    """The models an Ollama server lists, or ``None`` when it does not answer in time."""
    url = f"{ollama_url(host)}/api/tags"
    # Ollama is normally local: a proxy from the environment would only get in the way.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            payload = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    models = payload.get("models") if isinstance(payload, dict) else None
    return [m["name"] for m in models or [] if isinstance(m, dict) and m.get("name")]


def detect_llm(*, timeout: float = 0.5) -> tuple[BaseChatModel | None, str]:
    """The real chat model this machine offers, if any, and a sentence saying which.

    Tried in order:

    1. ``OPENAI_API_KEY`` is set and ``langchain-openai`` is installed: ``ChatOpenAI``
       with ``$TIERED_MEMORY_OPENAI_MODEL`` (default ``gpt-4o-mini``).
    2. An Ollama server answers ``GET /api/tags`` within ``timeout`` seconds at
       ``$OLLAMA_HOST`` (default ``http://127.0.0.1:11434``) and ``langchain-ollama``
       is installed: ``ChatOllama`` with ``$TIERED_MEMORY_OLLAMA_MODEL``, else the first
       model the server lists, run with a context of ``$TIERED_MEMORY_OLLAMA_NUM_CTX``
       tokens (default :data:`DEFAULT_OLLAMA_NUM_CTX`).

    Args:
        timeout: Seconds to wait for Ollama.

    Returns:
        ``(model, description)``; ``model`` is ``None`` when nothing was found, and
        the description then says why each option was not used.

    Raises:
        ValueError: If ``$TIERED_MEMORY_OLLAMA_NUM_CTX`` is not a whole number.

    Example:
        .. code-block:: python

            llm, description = detect_llm()
            print(description)
            llm = llm or ScriptedChatModel()
    """
    reasons: list[str] = []
    if os.environ.get("OPENAI_API_KEY"):
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            reasons.append(
                "OPENAI_API_KEY is set but langchain-openai is not installed "
                "(pip install 'langchain-tiered-memory[openai]')"
            )
        else:
            model = os.environ.get("TIERED_MEMORY_OPENAI_MODEL") or DEFAULT_OPENAI_MODEL
            return ChatOpenAI(model=model), f"OpenAI {model} (OPENAI_API_KEY)"
    else:
        reasons.append("no OPENAI_API_KEY")
    host = ollama_url()
    models = ollama_models(host, timeout)
    if models is None:
        reasons.append(f"no Ollama answering at {host}")
    else:
        chosen = os.environ.get("TIERED_MEMORY_OLLAMA_MODEL") or (models[0] if models else None)
        if chosen is None:
            reasons.append(f"the Ollama at {host} has no model pulled")
        else:
            try:
                from langchain_ollama import ChatOllama
            except ImportError:
                reasons.append(
                    f"an Ollama answers at {host} but langchain-ollama is not installed "
                    "(pip install 'langchain-tiered-memory[ollama]')"
                )
            else:
                num_ctx = ollama_num_ctx()
                return (
                    ChatOllama(model=chosen, base_url=host, num_ctx=num_ctx),
                    f"Ollama {chosen} at {host} (context {num_ctx} tokens)",
                )
    return None, "no LLM found: " + "; ".join(reasons)


def ollama_num_ctx() -> int:
    """The context an Ollama model is run with: ``$TIERED_MEMORY_OLLAMA_NUM_CTX``.

    Raises:
        ValueError: If it is set to anything but a whole number from 1,024.
    """
    raw = os.environ.get("TIERED_MEMORY_OLLAMA_NUM_CTX", "").strip()
    if not raw:
        return DEFAULT_OLLAMA_NUM_CTX
    if not raw.isascii() or not raw.isdigit() or not 1024 <= int(raw) <= 10_000_000:
        msg = (
            f"TIERED_MEMORY_OLLAMA_NUM_CTX must be a whole number of tokens from 1024, got {raw!r}"
        )
        raise ValueError(msg)
    return int(raw)


# -- the stand-in -------------------------------------------------------------

_CONSOLIDATION = re.compile(r"^## (?:Conversation to process|需要处理的对话)\s*$", re.MULTILINE)
_SPEAKER = re.compile(r"^(User|Assistant|用户|助手): (.*)$")
_IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")
_PREFERENCE = re.compile(r"\b(prefer|always|never|please use)\b|喜欢|偏好|总是", re.IGNORECASE)
_TITLE = "# MEMORY (scripted consolidation: lines copied from the conversation, no LLM)"
_SECTIONS = (
    "User preferences and habits",
    "Known database facts",
    "Solved problems and their answers",
    "Open problems",
)
_NONE_YET = "- (none yet)"
_KEEP = 12  # bullets kept per section


def _text(message: BaseMessage) -> str:
    return message.text if isinstance(message.text, str) else str(message.content)


def _first_sentence(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    match = re.search(r"(?<=[.!?。！？])\s", text)
    sentence = text[: match.start()] if match else text
    return sentence if len(sentence) <= limit else sentence[: limit - 1] + "…"


class ScriptedChatModel(BaseChatModel):
    """A chat model that does not generate: it answers from a script or from its prompt.

    Made for demos and notebooks without a real LLM, and labelled as such. It
    answers in three ways:

    * a question found in ``script`` gets its scripted answer;
    * a consolidation prompt (see :class:`~langchain_tiered_memory.MemoryConsolidator`)
      gets a MEMORY.md assembled from the conversation's lines: preferences, lines
      naming tables or fields, question/answer pairs;
    * any other question is answered by quoting the long-term memories found in
      the system prompt (lines starting with ``- ``), so recall is visible.

    Args:
        script: Answers keyed by the exact text of the last human message.
    """

    script: Mapping[str, str] = Field(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        question = next((_text(m) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        question = _QUESTION.split(question)[-1]  # the v3 prompt: documents, then the question
        if _CONSOLIDATION.search(question):
            answer = self._memory_md(question)
        elif question.strip() in self.script:
            answer = self.script[question.strip()]
        else:
            answer = self._from_memories(messages)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(answer))])

    @staticmethod
    def _from_memories(messages: list[BaseMessage]) -> str:
        system = "\n".join(_text(m) for m in messages if isinstance(m, SystemMessage))
        memories = [line[2:].strip() for line in system.splitlines() if line.startswith("- ")]
        if not memories:
            return "(scripted) I have nothing on that in memory."
        return f"(scripted, quoting the best long-term memory) {_first_sentence(memories[0], 400)}"

    @staticmethod
    def _memory_md(prompt: str) -> str:
        parts = _CONSOLIDATION.split(prompt, maxsplit=1)
        conversation = parts[1] if len(parts) > 1 else ""
        # The current MEMORY.md sits above the conversation: keep its bullets, by section.
        sections: dict[str, list[str]] = {title: [] for title in _SECTIONS}
        title = None
        for line in parts[0].splitlines():
            heading = re.match(r"^## (.+?)\s*$", line)
            if heading:
                title = heading.group(1) if heading.group(1) in sections else None
            elif title and line.startswith("- ") and line != _NONE_YET:
                sections[title].append(line)
        preferences, facts, solved, open_problems = sections.values()
        question: str | None = None
        for line in conversation.splitlines():
            match = _SPEAKER.match(line)
            if match is None:
                continue
            speaker, text = match.groups()
            if not text.strip():  # an AI message that only called a tool
                continue
            if speaker in ("User", "用户"):
                if _PREFERENCE.search(text):
                    preferences.append(f"- {_first_sentence(text)}")
                question = _first_sentence(text, 120)
            else:
                if _IDENTIFIER.search(text):
                    facts.append(f"- {_first_sentence(text)}")
                if question:
                    solved.append(f"- {question} -> {_first_sentence(text, 120)}")
                    question = None
        if question:
            open_problems.append(f"- {question}")
        body = [
            f"## {name}\n" + "\n".join(list(dict.fromkeys(lines))[-_KEEP:] or [_NONE_YET])
            for name, lines in sections.items()
        ]
        return "\n\n".join([_TITLE, *body])
