"""Tiered memory for LangChain: a bounded window over a durable archive, and more.

Importing this package imports modules and nothing else: no database is opened and
no model is loaded until a class is used.
"""

from langchain_tiered_memory.core.extras import MissingExtraError, import_extra
from langchain_tiered_memory.core.validation import EmbeddingDimensionError
from langchain_tiered_memory.memory.history import TieredChatMessageHistory
from langchain_tiered_memory.storage.archive import (
    ArchivedMessage,
    ArchiveRefusedError,
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

# Entry points whose modules import optional extras load on first use: name -> (module,
# the extra it needs or None). A missing extra raises MissingExtraError naming it.
_LAZY: dict[str, tuple[str, str | None]] = {
    "FinishReasonHandler": ("langchain_tiered_memory.integrations.finish_reason", None),
    "KnowledgeBase": ("langchain_tiered_memory.integrations.knowledge", None),
    "TieredMemory": ("langchain_tiered_memory.integrations.classic", "classic"),
    "TieredMemoryMiddleware": ("langchain_tiered_memory.integrations.middleware", "agents"),
    "TieredStore": ("langchain_tiered_memory.integrations.store", "agents"),
    "create_tiered_chain": ("langchain_tiered_memory.integrations.chain", None),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, extra = _LAZY[name]
    if extra is None:
        from importlib import import_module

        return getattr(import_module(module), name)
    return getattr(import_extra(module, extra, name), name)


__all__ = [
    "ArchiveRefusedError",
    "ArchiveUnavailableError",
    "ArchivedMessage",
    "ChromaLongMemory",
    "ContextCompressor",
    "ContextOverflowError",
    "EmbeddingDimensionError",
    "FinishReasonHandler",
    "ForgetIncompleteError",
    "KnowledgeBase",
    "LongMemoryRetriever",
    "MissingExtraError",
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
