"""Tiered memory for LangChain: a bounded window over a durable archive, and more.

Importing this package imports modules and nothing else: no database is opened and
no model is loaded until a class is used.
"""

from langchain_tiered_memory.archive import (
    ArchivedMessage,
    ArchiveUnavailableError,
    MySQLBackup,
    SessionInfo,
)
from langchain_tiered_memory.compression import ContextCompressor, ContextOverflowError
from langchain_tiered_memory.consolidation import MemoryConsolidator
from langchain_tiered_memory.history import TieredChatMessageHistory
from langchain_tiered_memory.long_memory import ChromaLongMemory, LongMemoryRetriever
from langchain_tiered_memory.session_files import SessionFileArchive
from langchain_tiered_memory.tokens import estimate_tokens

__all__ = [
    "ArchiveUnavailableError",
    "ArchivedMessage",
    "ChromaLongMemory",
    "ContextCompressor",
    "ContextOverflowError",
    "LongMemoryRetriever",
    "MemoryConsolidator",
    "MySQLBackup",
    "SessionFileArchive",
    "SessionInfo",
    "TieredChatMessageHistory",
    "estimate_tokens",
]
