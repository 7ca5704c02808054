"""Tiered memory for LangChain: a bounded window over a durable archive, and more.

Importing this package imports modules and nothing else: no database is opened and
no model is loaded until a class is used.
"""

from langchain_tiered_memory.memory.history import TieredChatMessageHistory
from langchain_tiered_memory.storage.archive import (
    ArchivedMessage,
    ArchiveUnavailableError,
    ForgetIncompleteError,
    MySQLBackup,
    SessionInfo,
    SessionOwnershipError,
)
from langchain_tiered_memory.storage.session_files import SessionFileArchive
from langchain_tiered_memory.text.tokens import estimate_tokens
from langchain_tiered_memory.tiers.compression import ContextCompressor, ContextOverflowError
from langchain_tiered_memory.tiers.consolidation import MemoryConsolidator
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory, LongMemoryRetriever

# The one place the version is written: pyproject.toml reads it (setuptools dynamic).
__version__ = "0.1.0"

# Entry points whose modules import optional extras (langchain-classic, langchain v1,
# langchain-text-splitters, langgraph) load on first use.
_LAZY = {
    "FinishReasonHandler": "langchain_tiered_memory.integrations.finish_reason",
    "KnowledgeBase": "langchain_tiered_memory.integrations.knowledge",
    "TieredMemory": "langchain_tiered_memory.integrations.classic",
    "TieredMemoryMiddleware": "langchain_tiered_memory.integrations.middleware",
    "TieredStore": "langchain_tiered_memory.integrations.store",
    "create_tiered_chain": "langchain_tiered_memory.integrations.chain",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


__all__ = [
    "ArchiveUnavailableError",
    "ArchivedMessage",
    "ChromaLongMemory",
    "ContextCompressor",
    "ContextOverflowError",
    "FinishReasonHandler",
    "ForgetIncompleteError",
    "KnowledgeBase",
    "LongMemoryRetriever",
    "MemoryConsolidator",
    "MySQLBackup",
    "TieredMemory",
    "TieredMemoryMiddleware",
    "TieredStore",
    "SessionFileArchive",
    "SessionInfo",
    "SessionOwnershipError",
    "TieredChatMessageHistory",
    "create_tiered_chain",
    "estimate_tokens",
]
