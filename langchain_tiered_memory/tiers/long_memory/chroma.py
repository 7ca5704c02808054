"""Chroma plumbing: the client factory, scope filters and the recorded store's eraser."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_tiered_memory.core.extras import import_extra
from langchain_tiered_memory.storage.archive import ForgetHook, default_home

#: Chroma and many stores cap a delete page; stay well under it.
PAGE = 100
#: The collection settings of every collection this package creates.
HNSW_METADATA = {"hnsw:space": "cosine", "hnsw:search_ef": 128, "hnsw:construction_ef": 128}


def chroma_settings() -> Any:
    """``chromadb`` settings with anonymized telemetry off."""
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


def make_chroma_client(
    client: Any = None,
    persist_directory: str | Path | None = None,
    host: str | None = None,
    port: int = 8000,
    *,
    feature: str = "ChromaLongMemory",
) -> Any:
    """A ``chromadb`` client, telemetry off.

    Args:
        client: A ready client; returned as it is.
        persist_directory: Folder of an embedded ``PersistentClient`` (created if
            need be); default ``$TIERED_MEMORY_HOME/chroma``.
        host: A Chroma server (``chroma run``); used when neither ``client`` nor
            ``persist_directory`` is given.
        port: The server's port.
        feature: What needs the client, named if the ``chroma`` extra is missing.
    """
    if client is not None:
        return client
    chromadb = import_extra("chromadb", "chroma", feature)
    if persist_directory is None and host is not None:
        return chromadb.HttpClient(host=host, port=port, settings=chroma_settings())
    path = Path(persist_directory) if persist_directory else default_home() / "chroma"
    path.mkdir(parents=True, exist_ok=True)
    return chromadb.PersistentClient(path=str(path), settings=chroma_settings())


#: What Chroma says when a collection's local HNSW files are damaged.
DAMAGE = (
    "Failed to apply logs",  # the files are behind the write-ahead log
    "hnsw segment reader",  # they cannot be read at all
    "hnsw segment writer",
    "Error deserializing pickle file",  # its metadata file is cut short
)


def is_damaged(exc: BaseException) -> bool:
    """Whether Chroma failed because the collection's local HNSW files are damaged.

    A process killed in the middle of an embedded ``PersistentClient`` write can
    leave the collection's HNSW files behind its write-ahead log, or its metadata
    file cut short; from then on every read and write of the collection fails with
    an ``InternalError`` such as ``... Failed to apply logs to the hnsw segment
    writer`` (chroma-core/chroma#5366) or ``... Error constructing hnsw segment
    reader: ... Error deserializing pickle file``. Only a new collection recovers,
    which the catalog can fill.
    """
    return type(exc).__name__ == "InternalError" and any(sign in str(exc) for sign in DAMAGE)


#: How Chroma's ``HttpClient`` begins the ``ValueError`` it raises when no server answers.
NO_SERVER = "Could not connect to a Chroma server"


def is_unreachable(exc: BaseException) -> bool:
    """Whether Chroma's ``HttpClient`` failed because no server answers."""
    return isinstance(exc, ValueError) and str(exc).startswith(NO_SERVER)


def is_gone(exc: BaseException) -> bool:
    """Whether Chroma failed because the collection was deleted under this handle."""
    return type(exc).__name__ == "NotFoundError"


def refused_name(exc: BaseException, name: str) -> ValueError | None:
    """The error for a collection name Chroma refuses (too short, bad characters); else ``None``."""
    if type(exc).__name__ != "InvalidArgumentError":  # chromadb's, for a bad name
        return None
    return ValueError(f"collection_name {name!r} is refused by Chroma: {exc}")


def chroma_where(session_id: str | None, user_id: str | None) -> dict[str, Any]:
    """The metadata filter of a scope (a session, a user, or a user's session)."""
    clauses: list[dict[str, Any]] = []
    if session_id is not None:
        clauses.append({"session_id": session_id})
    if user_id is not None:
        clauses.append({"user_id": user_id})
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def delete_where(collection: Any, where: dict[str, Any]) -> None:
    """Delete every vector of a scope, page by page (never a reset, never unscoped)."""
    while True:
        ids = collection.get(where=where, limit=PAGE, include=[])["ids"]
        if not ids:
            return
        collection.delete(ids=ids)


def chroma_locator(
    client: Any, persist_directory: Any, host: str | None, port: int, collection_name: str
) -> dict[str, Any] | None:
    """Where the vectors live, as any process can reach them; ``None`` if none can.

    An embedded store is its absolute folder, a server its host and port (never its
    credentials), plus the collection. An in-memory client (or an object that is no
    ``chromadb`` client) has no place another process could open.
    """
    where: dict[str, Any]
    if client is not None:
        try:
            settings = client.get_settings()
        except Exception:
            return None
        if settings.is_persistent and settings.persist_directory:
            where = {"persist_directory": os.path.abspath(settings.persist_directory)}
        elif settings.chroma_api_impl.endswith(".FastAPI") and settings.chroma_server_host:
            where = {
                "host": settings.chroma_server_host,
                "port": int(settings.chroma_server_http_port or 8000),
            }
            if settings.chroma_server_ssl_enabled:
                where["ssl"] = True
        else:
            return None
        from chromadb.config import DEFAULT_DATABASE, DEFAULT_TENANT

        if getattr(client, "tenant", DEFAULT_TENANT) != DEFAULT_TENANT:
            where["tenant"] = client.tenant
        if getattr(client, "database", DEFAULT_DATABASE) != DEFAULT_DATABASE:
            where["database"] = client.database
    elif persist_directory is None and host is not None:
        where = {"host": host, "port": int(port)}
    else:
        path = Path(persist_directory) if persist_directory else default_home() / "chroma"
        where = {"persist_directory": os.path.abspath(path)}
    return {**where, "collection": collection_name}


def erase_from_record(locator: dict[str, Any]) -> ForgetHook:
    """The eraser of a recorded Chroma store (entry point ``chroma``).

    It opens the store the locator names, without creating anything: a folder or a
    collection that no longer exists holds no vector. Then it deletes every vector
    of the forgotten scope by its metadata, page by page. A server that does not
    answer raises, so the forget is reported incomplete.
    """

    def erase(session_ids: Sequence[str], session_id: str | None, user_id: str | None) -> None:
        chromadb = import_extra("chromadb", "chroma", "forgetting Chroma memories")
        from chromadb.config import DEFAULT_DATABASE, DEFAULT_TENANT
        from chromadb.errors import NotFoundError

        place = {
            "tenant": locator.get("tenant", DEFAULT_TENANT),
            "database": locator.get("database", DEFAULT_DATABASE),
            "settings": chroma_settings(),
        }
        if "persist_directory" in locator:
            path = Path(locator["persist_directory"])
            if not path.is_dir():
                return
            client = chromadb.PersistentClient(path=str(path), **place)
        else:
            client = chromadb.HttpClient(
                host=locator["host"], port=locator["port"], ssl=locator.get("ssl", False), **place
            )
        try:
            collection = client.get_collection(locator["collection"], embedding_function=None)
        except NotFoundError:
            return
        delete_where(collection, chroma_where(session_id, user_id))

    return erase
