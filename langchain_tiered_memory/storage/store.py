"""The tables and plans of a LangGraph key-value store in the archive database.

``<name>_store_ns`` holds each namespace once (its id orders namespaces by first
write, as LangGraph's ``InMemoryStore`` does) and ``<name>_store`` the items. Every
operation is data (LangGraph's ``GetOp``/``PutOp``/``SearchOp``/``ListNamespacesOp``):
:meth:`StorePlanner.prepare` validates a batch and says what needs embedding, and
:meth:`StorePlanner.plan` turns it into one plan of statements that the archive's
sync or async driver runs in one transaction. The public class is
:class:`~langchain_tiered_memory.integrations.store.TieredStore`.

Why it is shaped so:

* Lookups go through a sha256 of ``(namespace, key)``: MySQL's ``PAD SPACE``
  collations compare ``"k "`` equal to ``"k"``, a hash never does.
* A namespace is stored as its labels joined and closed by dots (``"a.b."``), so a
  prefix is one index range (``>= "a.b."`` and ``< "a.b/"``) on both databases.
* Filters are LangGraph's (exact match, nested dicts, ``$eq``/``$ne``/``$gt``/
  ``$gte``/``$lt``/``$lte``) and evaluated in process over the prefix's rows, so
  both databases agree with ``InMemoryStore`` to the letter.
* Vectors are base64 float64 text: portable across drivers, exact.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import reprlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
)
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    delete,
    exists,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from langchain_tiered_memory.core.encoding import exact_json
from langchain_tiered_memory.core.validation import (
    MAX_COUNT,
    MAX_NESTING,
    check_characters,
    nesting_depth,
)
from langchain_tiered_memory.storage.base import MAX_PACKET_BYTES, Plan, utcnow
from langchain_tiered_memory.text.embeddings import OtherModelWarning
from langchain_tiered_memory.text.lexical import BM25Index, fuse, tokenize
from langchain_tiered_memory.text.similarity import similarities

T = TypeVar("T")

#: Longest namespace, as its labels joined by dots (an indexed column on MySQL).
MAX_NAMESPACE_CHARS = 500
#: Longest key.
MAX_KEY_CHARS = 1024
#: The control characters a key may hold: a key is a TEXT column reached through a
#: hash, and keys made from text (``fact[:40]``) often hold line breaks or tabs.
KEY_CONTROL_CHARACTERS = "\t\n\r"
#: Longest TTL accepted, in minutes (ten years: more overflows DATETIME columns).
MAX_TTL_MINUTES = 10 * 365 * 24 * 60.0
#: The comparison operators of LangGraph's filters.
OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
#: Rows per statement: SQLite caps a statement's parameters (32766), MySQL its size.
CHUNK = 500
#: Bytes of data per statement, and so the largest item: the driver's escaping may
#: double them, and the SQL around them needs room, within one packet.
STATEMENT_BYTES = MAX_PACKET_BYTES // 2 - 64 * 1024
#: What a row's short columns (hash, ids, timestamps, TTL) add to its size, at most.
ROW_BYTES = 256


class InvalidKeyError(ValueError):
    """A store key is not a usable key (not a string, empty, too long, unstorable)."""


class InvalidFilterError(ValueError):
    """A search filter LangGraph's filters cannot evaluate: an operator they lack, or too deep."""


class ValueTooLargeError(ValueError):
    """A store item is too large to write: it would not fit in one statement.

    Its value, the tokens and the vectors of its indexed texts are one row, and a
    row is one statement of at most :data:`STATEMENT_BYTES` bytes (MySQL refuses a
    statement over its ``max_allowed_packet`` by dropping the connection).

    Attributes:
        namespace: The item's namespace.
        key: The item's key.
        size: The bytes its row would take.
        limit: The most a row may take.
    """

    def __init__(self, namespace: tuple[str, ...], key: str, size: int, limit: int) -> None:
        self.namespace = namespace
        self.key = key
        self.size = size
        self.limit = limit
        super().__init__(
            f"the item {reprlib.repr(key)} in namespace {namespace!r} takes {size:,} bytes "
            f"to store (its value, and the tokens and vectors of its indexed texts); "
            f"the limit is {limit:,} bytes"
        )


def _long_text() -> Text:
    return Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _timestamp() -> DateTime:
    return DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _id() -> BigInteger:
    return BigInteger().with_variant(Integer, "sqlite")


_MYSQL: dict[str, Any] = {
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mysql_engine": "InnoDB",
}


@dataclass(frozen=True)
class StoreTables:
    """The store's two tables."""

    namespaces: Table
    items: Table


def build_store_tables(metadata: MetaData, name: str) -> StoreTables:
    """Define the store's tables on ``metadata`` beside the archive named ``name``."""
    namespaces = Table(
        f"{name}_store_ns",
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("hash", String(64), nullable=False, unique=True),
        # The labels joined by dots, with a closing dot: "a.b." (see the module docstring).
        Column("path", String(MAX_NAMESPACE_CHARS + 1), nullable=False),
        Column("created_at", _timestamp(), nullable=False),
        Index(f"ix_{name}_store_ns_path", "path"),
        sqlite_autoincrement=True,
        **_MYSQL,
    )
    items = Table(
        f"{name}_store",
        metadata,
        Column("id", _id(), primary_key=True, autoincrement=True),
        Column("hash", String(64), nullable=False, unique=True),
        Column("ns_id", BigInteger, nullable=False),
        Column("key", Text, nullable=False),
        Column("value", _long_text(), nullable=False),
        # The BM25 tokens of the texts indexed for search, space-separated (a token never
        # holds a space), so a query does not tokenize its candidates; NULL: not indexed.
        Column("tokens", _long_text(), nullable=True),
        # JSON list of base64 float64 vectors, one per indexed text; NULL: none.
        Column("vectors", _long_text(), nullable=True),
        # The embedding model that made ``vectors`` (``model_name``); NULL: unknown.
        Column("model", String(191), nullable=True),
        Column("created_at", _timestamp(), nullable=False),
        Column("updated_at", _timestamp(), nullable=False),
        Column("ttl_minutes", Float, nullable=True),
        Column("expires_at", _timestamp(), nullable=True),
        Index(f"ix_{name}_store_ns_id", "ns_id", "id"),
        Index(f"ix_{name}_store_expires", "expires_at"),
        sqlite_autoincrement=True,
        **_MYSQL,
    )
    return StoreTables(namespaces=namespaces, items=items)


# -- validation ---------------------------------------------------------------


def validate_namespace(
    namespace: Any, *, allow_empty: bool = True, wildcards: bool = False
) -> tuple[str, ...]:
    """Return ``namespace`` as a tuple if it is a usable namespace (or prefix), else raise.

    LangGraph's rules (string labels, none empty, no ``.``, no NUL), plus what a
    database needs: no control characters or lone surrogates, at most
    :data:`MAX_NAMESPACE_CHARS` characters joined.

    Args:
        namespace: A tuple (or list) of labels.
        allow_empty: Whether ``()`` is accepted (a prefix of everything).
        wildcards: Whether ``"*"`` is a wildcard (match conditions), not a label.

    Raises:
        InvalidNamespaceError: If it is not.
    """
    if not isinstance(namespace, tuple | list):
        msg = f"a namespace must be a tuple of str, got {type(namespace).__name__}"
        raise InvalidNamespaceError(msg)
    labels = tuple(namespace)
    if not labels and not allow_empty:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    for label in labels:
        if not isinstance(label, str):
            msg = f"namespace label {label!r} in {labels!r} is a {type(label).__name__}, not a str"
            raise InvalidNamespaceError(msg)
        if not label:
            raise InvalidNamespaceError(f"namespace labels cannot be empty, got {labels!r}")
        if "." in label and not (wildcards and label == "*"):
            msg = f"namespace label {label!r} in {labels!r} contains a period ('.')"
            raise InvalidNamespaceError(msg)
        check_characters(label, f"namespace label {label!r}", InvalidNamespaceError)
    joined = sum(map(len, labels)) + len(labels)
    if joined > MAX_NAMESPACE_CHARS:
        limit = MAX_NAMESPACE_CHARS
        msg = f"namespace {labels!r} is {joined} characters joined; the limit is {limit}"
        raise InvalidNamespaceError(msg)
    return labels


def validate_key(key: Any) -> str:
    """Return ``key`` if it is a usable item key, else raise :class:`InvalidKeyError`.

    A key is a non-empty str of at most :data:`MAX_KEY_CHARS` characters, without
    NUL, lone surrogates (utf8mb4 cannot store them) or control characters other
    than :data:`KEY_CONTROL_CHARACTERS`.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"a key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidKeyError("a key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidKeyError(f"a key is {len(key)} characters long; the limit is {MAX_KEY_CHARS}")
    check_characters(key, f"key {key[:40]!r}", InvalidKeyError, allowed=KEY_CONTROL_CHARACTERS)
    return key


def validate_filter(filter_: Any) -> dict[str, Any] | None:
    """Return ``filter_`` if LangGraph's filter semantics can evaluate it, else raise.

    A filter is read as LangGraph's stores read it. Its own keys are field names,
    whatever they look like (``{"$schema": "draft-07"}`` matches that field). A
    field's condition that is a dict with a key starting with ``$`` is a dict of
    operators, each one of :data:`OPERATORS` (PostgresStore refuses another key
    beside them, InMemoryStore fails on it), whose operands are values; a dict
    without one is matched field by field, and a list item by item, each item a
    condition again.

    Raises:
        InvalidFilterError: If ``filter_`` is not a dict, uses another operator, or
            describes a value nesting deeper than :data:`MAX_NESTING` levels (no
            stored value does, and a walk that deep would exhaust Python's stack).
    """
    if filter_ is None:
        return None
    if not isinstance(filter_, Mapping):
        raise InvalidFilterError(f"a filter must be a dict, got {type(filter_).__name__}")
    # Each condition with the depth of the dict or list holding the field it matches
    # (the filter's own keys name fields of the value, at depth 1); walked without
    # recursion, so that a filter of any depth gets a typed error.
    stack: list[tuple[Any, int]] = [(condition, 1) for condition in filter_.values()]
    while stack:
        condition, level = stack.pop()
        if isinstance(condition, Mapping) and any(_is_operator(name) for name in condition):
            for name, operand in condition.items():
                if name not in OPERATORS:
                    msg = f"unsupported filter operator {name!r}; use one of {sorted(OPERATORS)}"
                    raise InvalidFilterError(msg)
                # An operand is a value, compared at the field's place ({"$eq": {"$ref":
                # ...}} compares a JSON Schema reference).
                if level + nesting_depth(operand, MAX_NESTING - level) > MAX_NESTING:
                    raise _too_deep()
        elif isinstance(condition, Mapping | list | tuple):
            if level + 1 > MAX_NESTING:
                raise _too_deep()
            inner = condition.values() if isinstance(condition, Mapping) else condition
            stack.extend((item, level + 1) for item in inner)
    return dict(filter_)


def _too_deep() -> InvalidFilterError:
    return InvalidFilterError(
        f"a filter nests deeper than {MAX_NESTING} levels, deeper than any stored value"
    )


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be between {minimum} and {MAX_COUNT}, got {value}")
    return value


def validate_ttl(ttl: Any) -> float | None:
    """Return a TTL in minutes (``None``: none) if it is usable, else raise ``ValueError``."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of minutes, got {type(ttl).__name__}")
    if not (0 < ttl <= MAX_TTL_MINUTES) or math.isnan(ttl):
        raise ValueError(f"ttl must be over 0 and at most {MAX_TTL_MINUTES:g} minutes, got {ttl}")
    return float(ttl)


# -- LangGraph's filter and namespace-matching semantics ------------------------


def matches_filter(value: Mapping[str, Any], filter_: Mapping[str, Any] | None) -> bool:
    """Whether a stored value passes a LangGraph search filter (JSONB-like semantics).

    ``filter_`` is one :func:`validate_filter` accepts: its keys are field names.

    Raises:
        InvalidFilterError: If the walk goes deeper than :data:`MAX_NESTING` levels.
    """
    return not filter_ or all(_compare(value.get(k), f, 1) for k, f in filter_.items())


def _is_operator(name: Any) -> bool:
    """Whether a filter's dict key names an operator (its dict is then one of operators)."""
    return isinstance(name, str) and name.startswith("$")


def _compare(value: Any, wanted: Any, level: int) -> bool:
    """Whether ``value`` meets ``wanted``, a condition on a field at depth ``level``."""
    if isinstance(wanted, Mapping) and any(_is_operator(k) for k in wanted):
        return all(_apply(value, op, operand) for op, operand in wanted.items())
    if isinstance(wanted, Mapping | list | tuple) and level + 1 > MAX_NESTING:
        raise _too_deep()  # validate_filter refuses it first; a stored value is never this deep
    if isinstance(wanted, Mapping):
        if not isinstance(value, Mapping):
            return False
        return all(_compare(value.get(k), v, level + 1) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_compare(v, w, level + 1) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _apply(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if isinstance(value, int | float) and isinstance(operand, int | float):
        # Python compares ints and floats exactly, and never overflows: 10**400 is a
        # valid JSON number that float() refuses.
        left, right = value, operand
    else:
        try:  # InMemoryStore's float() reading: "5" is 5, "x" is no number
            left, right = float(value), float(operand)
        except (TypeError, ValueError, OverflowError):
            return False  # a missing, non-numeric or unreadable field is never in a range
    if operator == "$gt":
        return left > right
    if operator == "$gte":
        return left >= right
    if operator == "$lt":
        return left < right
    return left <= right  # "$lte" (validate_filter refused the others)


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` meets a prefix or suffix condition (``"*"`` matches any label)."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"unsupported match type {condition.match_type!r}")
    return all(want in ("*", label) for label, want in pairs)


# -- encoding -----------------------------------------------------------------


def namespace_path(namespace: Sequence[str]) -> str:
    """The stored form of a namespace: ``("a", "b")`` is ``"a.b."``."""
    return "".join(f"{label}." for label in namespace)


def _split_path(path: str) -> tuple[str, ...]:
    return tuple(path[:-1].split(".")) if path else ()


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode("ascii")).hexdigest()


def _encode_vector(vector: Sequence[float]) -> str:
    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f8").tobytes()).decode("ascii")


def _encode_vectors(vectors: Iterable[Sequence[float]]) -> str:
    """The stored form of an item's vectors: a JSON list of them, each in base64."""
    return json.dumps([_encode_vector(vector) for vector in vectors])


def _vectors_bytes(count: int, dims: int) -> int:
    """The length of :func:`_encode_vectors` of ``count`` vectors of ``dims`` floats."""
    if not count:
        return 0
    quoted = 4 * math.ceil(8 * dims / 3) + 2  # base64 of 8-byte floats, in quotes
    return 2 + count * quoted + 2 * (count - 1)  # "[", "]" and ", " between them


def _decode_vector(text: str) -> Any:
    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype="<f8")


def _chunks(rows: Sequence[T], sizes: Sequence[int] | None = None) -> Iterator[Sequence[T]]:
    """``rows`` in runs of at most :data:`CHUNK` rows and, given their ``sizes``, bytes."""
    if sizes is None:
        yield from (rows[start : start + CHUNK] for start in range(0, len(rows), CHUNK))
        return
    start, total = 0, 0
    for end, size in enumerate(sizes):
        if end > start and (end - start == CHUNK or total + size > STATEMENT_BYTES):
            yield rows[start:end]
            start, total = end, 0
        total += size
    if start < len(rows):
        yield rows[start:]


def _encode(
    op: PutOp, texts: list[tuple[str, str]] | None, dims: int | None
) -> tuple[str, str | None] | None:
    """A put's stored value and BM25 tokens (``None``: a delete), refused if too large.

    Given ``dims``, the size of the vectors its texts will have counts too, so that
    a row too large is refused before anything is embedded.
    """
    if op.value is None:
        return None
    value = exact_json(dict(op.value))
    tokens = None
    if texts is not None:
        tokens = " ".join(token for _, text in texts for token in tokenize(text))
    _check_size(op, value, tokens, _vectors_bytes(len(texts or ()), dims) if dims else 0)
    return value, tokens


def _check_size(op: PutOp, value: str, tokens: str | None, vectors: int) -> int:
    """The bytes of the row of ``op``, escaping aside; raise if too many.

    Refused up front: a statement over ``max_allowed_packet`` makes MySQL drop the
    connection, which looks like an outage instead of a bad value.

    Args:
        op: The put.
        value: Its stored value.
        tokens: Its BM25 tokens, if indexed.
        vectors: The length of its stored vectors (ASCII), if any.
    """
    texts = (value, tokens)
    size = ROW_BYTES + sum(len(text.encode("utf-8", "surrogatepass")) for text in texts if text)
    size += len(op.key.encode("utf-8")) + vectors
    if size > STATEMENT_BYTES:
        raise ValueTooLargeError(tuple(op.namespace), op.key, size, STATEMENT_BYTES)
    return size


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


# -- planning -----------------------------------------------------------------


@dataclass
class PreparedBatch:
    """A validated batch: its ops, deduplicated puts, and what must be embedded first.

    Attributes:
        ops: The ops, in order (results come back in this order).
        puts: The last put of each ``(namespace, key)``, in order of first appearance.
        texts: Per put (same order), the texts indexed for search (``None``: none).
        encoded: Per put (same order), its stored value and BM25 tokens (``None``:
            a delete).
        to_embed: The distinct texts to embed for the puts.
        queries: The distinct search queries to embed.
    """

    ops: list[Op]
    puts: list[PutOp] = field(default_factory=list)
    texts: list[list[tuple[str, str]] | None] = field(default_factory=list)
    encoded: list[tuple[str, str | None] | None] = field(default_factory=list)
    to_embed: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        """Whether running the batch writes (reads alone need no transaction)."""
        return bool(self.puts)


#: The TTL refreshes reads call for: ``{ttl_minutes: {(item id, updated_at)}}``, the
#: versions of the items they read. A refresh applies to that version only: a put
#: committed since (``ttl=None`` among them) has set its own expiry.
Refresh = dict[float, set[tuple[int, datetime]]]


@dataclass
class BatchOutcome:
    """What a batch's plan returns.

    Attributes:
        results: One per op, in order.
        refresh: The TTL refreshes its reads call for (see :data:`Refresh`), left
            for :meth:`StorePlanner.refresh_plan` when the batch did not write
            (empty when it did: they ran in its transaction).
    """

    results: list[Result]
    refresh: Refresh


@dataclass(frozen=True)
class _Row:
    id: int
    ns_path: str
    key: str
    value: str
    tokens: str | None
    vectors: str | None
    model: str | None
    created_at: datetime
    updated_at: datetime
    ttl_minutes: float | None

    def item(self) -> Item:
        return Item(
            value=json.loads(self.value),
            key=self.key,
            namespace=_split_path(self.ns_path),
            created_at=_aware(self.created_at),
            updated_at=_aware(self.updated_at),
        )

    def search_item(self, value: dict[str, Any], score: float | None) -> SearchItem:
        return SearchItem(
            namespace=_split_path(self.ns_path),
            key=self.key,
            value=value,
            created_at=_aware(self.created_at),
            updated_at=_aware(self.updated_at),
            score=score,
        )


class StorePlanner:
    """Turns a batch of LangGraph store ops into one plan, for either driver.

    Args:
        tables: The store's tables.
        dialect: ``"sqlite"``, ``"mysql"`` or ``"mariadb"``.
        fields: The default paths indexed for search (LangGraph's path syntax;
            ``["$"]``: the whole value).
        model: The name of the embedding model (``model_name``) when puts are
            embedded (an ``index`` with ``embed`` was given), else ``None``.
        dims: The size of the model's vectors, if known: an item whose row would be
            too large with them is then refused before anything is embedded.
        dense_weight: Weight of vector similarity against BM25 in a query's ranking,
            in [0, 1]; 1 ranks by cosine similarity alone, as ``InMemoryStore`` does.
    """

    def __init__(
        self,
        tables: StoreTables,
        dialect: str,
        *,
        fields: Sequence[str] = ("$",),
        model: str | None = None,
        dims: int | None = None,
        dense_weight: float = 0.6,
    ) -> None:
        self.tables = tables
        self.dialect = dialect
        self.fields = [(path, tokenize_path(path) if path != "$" else path) for path in fields]
        self.model = model
        self.dims = None if dims is None else _count("dims", dims, 1)
        self._other_models = OtherModelWarning("put them again")
        self.dense_weight = dense_weight

    @property
    def embeds(self) -> bool:
        """Whether puts are embedded."""
        return self.model is not None

    # -- prepare ------------------------------------------------------------

    def prepare(self, ops: Iterable[Op]) -> PreparedBatch:
        """Validate ``ops`` and collect what must be embedded before :meth:`plan`.

        Raises:
            InvalidNamespaceError, InvalidKeyError, InvalidFilterError: On bad input;
                nothing of the batch has run.
            ValueTooLargeError: If a put's value, indexed tokens and (given ``dims``)
                vectors pass :data:`STATEMENT_BYTES` (before anything is embedded or
                run).
            TypeError, ValueError: On a bad limit, offset, TTL or op.
        """
        batch = PreparedBatch(ops=list(ops))
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        queries: dict[str, None] = {}
        for op in batch.ops:
            if isinstance(op, GetOp):
                validate_namespace(op.namespace)
                validate_key(op.key)
            elif isinstance(op, PutOp):
                namespace = validate_namespace(op.namespace, allow_empty=False)
                if namespace[0] == "langgraph":
                    raise InvalidNamespaceError(
                        f'the root label of a namespace cannot be "langgraph", got {namespace!r}'
                    )
                validate_key(op.key)
                self._check_value(op.value)
                validate_ttl(op.ttl)
                # The last put of a key wins, at the place of its first (as InMemoryStore).
                puts[(namespace, op.key)] = op
            elif isinstance(op, SearchOp):
                validate_namespace(op.namespace_prefix)
                validate_filter(op.filter)
                _count("limit", op.limit, 0)
                _count("offset", op.offset, 0)
                if op.query is not None and not isinstance(op.query, str):
                    raise TypeError(f"query must be a str, got {type(op.query).__name__}")
                if op.query and self.embeds:
                    queries[op.query] = None
            elif isinstance(op, ListNamespacesOp):
                for condition in op.match_conditions or ():
                    validate_namespace(condition.path, wildcards=True)
                    if condition.match_type not in ("prefix", "suffix"):
                        raise ValueError(f"unsupported match type {condition.match_type!r}")
                if op.max_depth is not None:
                    _count("max_depth", op.max_depth, 1)
                _count("limit", op.limit, 0)
                _count("offset", op.offset, 0)
            else:
                raise TypeError(f"unknown store operation: {type(op).__name__}")
        batch.puts = list(puts.values())
        batch.texts = [self._texts(op) for op in batch.puts]
        encoded = zip(batch.puts, batch.texts, strict=True)
        dims = self.dims if self.embeds else None
        batch.encoded = [_encode(op, texts, dims) for op, texts in encoded]
        if self.embeds:
            distinct = {text: None for texts in batch.texts for _, text in texts or ()}
            batch.to_embed = list(distinct)
        batch.queries = list(queries)
        return batch

    @staticmethod
    def _check_value(value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, Mapping):
            raise TypeError(f"a store value must be a dict (or None), got {type(value).__name__}")
        # One walk: its depth, and str keys at every level (JSON would turn 1 into "1").
        try:
            depth = nesting_depth(dict(value), MAX_NESTING, string_keys=True)
        except TypeError as exc:
            raise TypeError(f"a store value's {exc}") from exc
        if depth > MAX_NESTING:
            raise ValueError(f"a store value nests deeper than {MAX_NESTING} levels")
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a store value must be JSON-serialisable: {exc}") from exc

    def _texts(self, op: PutOp) -> list[tuple[str, str]] | None:
        if op.value is None or op.index is False:
            return None
        paths = self.fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
        texts: list[tuple[str, str]] = []
        value = dict(op.value)
        for path, tokens in paths:
            found = get_text_at_path(value, tokens)
            if len(found) > 1:
                texts.extend((f"{path}.{i}", text) for i, text in enumerate(found))
            elif found:
                texts.append((path, found[0]))
        return texts

    # -- plan ---------------------------------------------------------------

    def plan(
        self,
        batch: PreparedBatch,
        vectors: Mapping[str, Sequence[float]],
        query_vectors: Mapping[str, Sequence[float]],
        *,
        now: datetime | None = None,
    ) -> Plan[BatchOutcome]:
        """The statements of ``batch``; returns its results, in the order of its ops.

        Reads see the store as it was before the batch's puts (as LangGraph's stores).
        A batch of reads only returns the TTL refreshes it calls for instead of
        writing them, so that it runs without a write lock: the caller runs
        :meth:`refresh_plan` after it when there are any.

        Args:
            batch: From :meth:`prepare`.
            vectors: The embedding of each of ``batch.to_embed``.
            query_vectors: The embedding of each of ``batch.queries``.
            now: The batch's clock (naive UTC); default now.
        """
        now = now or utcnow()
        results: list[Result] = []
        refresh: Refresh = {}
        for op in batch.ops:
            read: list[_Row] = []
            if isinstance(op, GetOp):
                row = yield from self._get_plan(op, now)
                results.append(row.item() if row else None)
                read = [row] if row and op.refresh_ttl else []
            elif isinstance(op, SearchOp):
                hits = yield from self._search_plan(op, query_vectors, now)
                results.append([item for item, _ in hits])
                read = [row for _, row in hits] if op.refresh_ttl else []
            elif isinstance(op, ListNamespacesOp):
                results.append((yield from self._list_plan(op, now)))
            else:
                results.append(None)
            for row in read:
                if row.ttl_minutes:
                    refresh.setdefault(row.ttl_minutes, set()).add((row.id, row.updated_at))
        if not batch.writes:
            return BatchOutcome(results, refresh)
        yield from self.refresh_plan(refresh, now)
        yield from self._put_plan(batch, vectors, now)
        return BatchOutcome(results, {})

    def _live(self, now: datetime) -> Any:
        expires = self.tables.items.c.expires_at
        return or_(expires.is_(None), expires > now)

    def _row_select(self) -> Any:
        items, ns = self.tables.items, self.tables.namespaces
        return select(
            items.c.id,
            ns.c.path,
            items.c.key,
            items.c.value,
            items.c.tokens,
            items.c.vectors,
            items.c.model,
            items.c.created_at,
            items.c.updated_at,
            items.c.ttl_minutes,
        ).join(ns, ns.c.id == items.c.ns_id)

    def _prefix(self, prefix: Sequence[str]) -> Any:
        """The namespaces under ``prefix`` (itself included), as one index range."""
        path = self.tables.namespaces.c.path
        if not prefix:
            return None
        low = namespace_path(prefix)
        return and_(path >= low, path < low[:-1] + "/")  # "/" follows "." in every encoding

    def _get_plan(self, op: GetOp, now: datetime) -> Plan[_Row | None]:
        items = self.tables.items
        statement = self._row_select().where(
            items.c.hash == _hash(list(op.namespace), op.key), self._live(now)
        )
        found = (yield statement).first()
        return _Row(*found) if found else None

    def _search_plan(
        self, op: SearchOp, query_vectors: Mapping[str, Sequence[float]], now: datetime
    ) -> Plan[list[tuple[SearchItem, _Row]]]:
        items, ns = self.tables.items, self.tables.namespaces
        statement = self._row_select().where(self._live(now))
        prefix = self._prefix(op.namespace_prefix)
        if prefix is not None:
            statement = statement.where(prefix)
        statement = statement.order_by(ns.c.id, items.c.id)
        if not op.filter and not op.query:
            # Nothing to rank or filter in process: the database pages.
            page = yield statement.limit(op.limit).offset(op.offset)
            rows = [_Row(*found) for found in page]
            return [(row.search_item(json.loads(row.value), None), row) for row in rows]
        candidates: list[tuple[_Row, dict[str, Any]]] = []
        for found in (yield statement):
            row = _Row(*found)
            value = json.loads(row.value)
            if matches_filter(value, op.filter):
                candidates.append((row, value))
        if not op.query:
            page_rows = candidates[op.offset : op.offset + op.limit]
            return [(row.search_item(value, None), row) for row, value in page_rows]
        ranked = self.rank(op.query, candidates, query_vectors.get(op.query))
        page = ranked[op.offset : op.offset + op.limit]
        return [(row.search_item(value, score), row) for row, value, score in page]

    def rank(
        self,
        query: str,
        candidates: Sequence[tuple[_Row, dict[str, Any]]],
        query_vector: Sequence[float] | None,
    ) -> list[tuple[_Row, dict[str, Any], float | None]]:
        """Order candidates by the hybrid score of ``query``: scored ones first, best first.

        The score of an item is ``dense_weight`` times its best cosine similarity (the
        max over its indexed texts) plus the rest times its BM25 score (CJK-aware,
        over the candidates, divided by the best); without an embedding it is BM25
        alone. Items with neither follow, unscored, in store order.
        """
        import numpy as np

        dense: dict[str, float] = {}
        foreign: set[int] = set()
        if query_vector is not None:
            foreign = {
                position
                for position, (row, _) in enumerate(candidates)
                if row.vectors and row.model not in (None, self.model)
            }
            if foreign:  # ranked by their words alone
                others = {candidates[p][0].model for p in foreign}
                self._other_models(len(foreign), "the store's items", others, str(self.model))
            target = np.asarray(query_vector, dtype=np.float64)
            target_norm = np.linalg.norm(target)
            for position, (row, _) in enumerate(candidates):
                if not row.vectors or position in foreign:
                    continue
                matrix = np.stack([_decode_vector(v) for v in json.loads(row.vectors)])
                norms = np.linalg.norm(matrix, axis=1)
                sims = np.zeros_like(norms)
                mask = norms != 0
                sims[mask] = similarities(matrix[mask], target) / (norms[mask] * target_norm)
                dense[str(position)] = float(sims.max())
        weight = self.dense_weight if query_vector is not None else 0.0
        lexical: dict[str, float] = {}
        if weight < 1 or foreign:  # another model's items are ranked by their words
            index = BM25Index()
            terms = set(tokenize(query))
            for position, (row, _) in enumerate(candidates):
                if row.tokens is not None:
                    tokens = row.tokens.split()
                    wanted = [token for token in tokens if token in terms]
                    index.add_tokens(str(position), wanted, length=len(tokens))
            lexical = dict(index.search(query, len(candidates)))
        words_only = {str(position) for position in foreign}
        fused = (
            fuse(dense, lexical, dense_weight=weight, words_only=words_only)
            if dense or lexical
            else []
        )
        # Equal scores in store order: fuse breaks ties by id as a string ("10" < "2").
        fused.sort(key=lambda pair: (-pair[1], int(pair[0])))
        scored = {int(doc_id) for doc_id, _ in fused}
        ranked: list[tuple[_Row, dict[str, Any], float | None]] = [
            (*candidates[int(doc_id)], score) for doc_id, score in fused
        ]
        ranked.extend(
            (row, value, None)
            for position, (row, value) in enumerate(candidates)
            if position not in scored
        )
        return ranked

    def _list_plan(self, op: ListNamespacesOp, now: datetime) -> Plan[list[tuple[str, ...]]]:
        items, ns = self.tables.items, self.tables.namespaces
        statement = select(ns.c.path).where(
            exists().where(items.c.ns_id == ns.c.id, self._live(now))
        )
        for condition in op.match_conditions or ():
            if condition.match_type != "prefix":
                continue
            literal: list[str] = []
            for label in condition.path:
                if label == "*":
                    break
                literal.append(label)
            prefix = self._prefix(literal)
            if prefix is not None:
                statement = statement.where(prefix)
        found = [_split_path(path) for (path,) in (yield statement)]
        conditions = op.match_conditions or ()
        kept = [n for n in found if all(namespace_matches(c, n) for c in conditions)]
        if op.max_depth is not None:
            kept = list({n[: op.max_depth] for n in kept})
        return sorted(kept)[op.offset : op.offset + op.limit]

    def refresh_plan(self, refresh: Refresh, now: datetime | None = None) -> Plan[None]:
        """Push back the expiry of the item versions of ``refresh`` (see :data:`Refresh`).

        The refresh runs after the read, in another transaction for a batch of reads
        and without a lock on MySQL's READ COMMITTED for one that writes: an item put
        again meanwhile (``ttl=None`` making it permanent) is left as that put wrote
        it, so each update names the version read, by id and ``updated_at``.
        """
        now = now or utcnow()
        items = self.tables.items
        for minutes, versions in refresh.items():
            ordered = sorted(versions)  # ids in one order: fewer lock waits
            for chunk in _chunks(ordered):
                yield (
                    update(items)
                    .where(
                        tuple_(items.c.id, items.c.updated_at).in_(list(chunk)),
                        items.c.expires_at.is_not(None),
                    )
                    .values(expires_at=now + timedelta(minutes=minutes))
                )

    def _put_plan(
        self, batch: PreparedBatch, vectors: Mapping[str, Sequence[float]], now: datetime
    ) -> Plan[None]:
        if not batch.puts:
            return
        items, ns = self.tables.items, self.tables.namespaces
        # Sorted: the same keys are deleted in the same statements, in index order.
        deletes = sorted(_hash(list(op.namespace), op.key) for op in batch.puts if op.value is None)
        for hashes in _chunks(deletes):
            yield delete(items).where(items.c.hash.in_(hashes))
        writes = [
            (op, texts, encoded)
            for op, texts, encoded in zip(batch.puts, batch.texts, batch.encoded, strict=True)
            if encoded is not None
        ]
        if not writes:
            return
        # Namespaces first, in order of first write: their ids order searches.
        paths = {namespace_path(op.namespace): None for op, _, _ in writes}
        rows = [{"hash": _hash(path), "path": path, "created_at": now} for path in paths]
        ns_ids: dict[str, int] = {}
        for ns_rows in _chunks(rows):
            yield self._insert_ignore(ns, ns_rows)
            found = yield select(ns.c.hash, ns.c.id).where(
                ns.c.hash.in_([row["hash"] for row in ns_rows])
            )
            ns_ids.update(found.all())
        # A row is locked as it is written. The items that exist already are written
        # in one order, by namespace and key, so that two batches over the same keys
        # lock them alike instead of deadlocking (MySQL; a deadlock left reruns the
        # batch); new items follow in the order of their first put, which their ids
        # keep: the store order of searches.
        hashes = [_hash(list(op.namespace), op.key) for op, _, _ in writes]
        existing: set[str] = set()
        for some in _chunks(hashes):
            found = yield select(items.c.hash).where(items.c.hash.in_(some))
            existing.update(found.scalars())

        def lock_order(position: int) -> tuple[Any, ...]:
            op = writes[position][0]
            if hashes[position] in existing:
                return (0, tuple(op.namespace), op.key)
            return (1, position)

        writes = [writes[position] for position in sorted(range(len(writes)), key=lock_order)]
        values = []
        sizes = []
        for op, texts, (value, tokens) in writes:
            ttl = op.ttl  # BaseStore.put has applied the TTL config's default
            encoded = None
            if texts and self.embeds:
                encoded = _encode_vectors(vectors[text] for _, text in texts)
            # Again with the vectors as embedded: the model may not give ``dims`` floats.
            sizes.append(_check_size(op, value, tokens, len(encoded or "")))
            values.append(
                {
                    "hash": _hash(list(op.namespace), op.key),
                    "ns_id": ns_ids[_hash(namespace_path(op.namespace))],
                    "key": op.key,
                    "value": value,
                    "tokens": tokens,
                    "vectors": encoded,
                    "model": self.model if encoded is not None else None,
                    "created_at": now,
                    "updated_at": now,
                    "ttl_minutes": ttl,
                    "expires_at": None if ttl is None else now + timedelta(minutes=ttl),
                }
            )
        changed = (
            "ns_id",
            "key",
            "value",
            "tokens",
            "vectors",
            "model",
            "updated_at",
            "ttl_minutes",
            "expires_at",
        )
        for chunk in _chunks(values, sizes):
            if self.dialect == "sqlite":
                upsert = sqlite_insert(items).values(list(chunk))
                yield upsert.on_conflict_do_update(
                    index_elements=[items.c.hash], set_={c: upsert.excluded[c] for c in changed}
                )
            else:
                mysql_upsert = mysql_insert(items).values(list(chunk))
                yield mysql_upsert.on_duplicate_key_update(
                    {c: mysql_upsert.inserted[c] for c in changed}
                )

    def _insert_ignore(self, table: Table, rows: Sequence[dict[str, Any]]) -> Any:
        if self.dialect == "sqlite":
            return sqlite_insert(table).values(list(rows)).on_conflict_do_nothing()
        return insert(table).values(list(rows)).prefix_with("IGNORE")

    def sweep_plan(self, now: datetime | None = None) -> Plan[int]:
        """Delete the expired items; returns how many."""
        items = self.tables.items
        now = now or utcnow()
        result = yield delete(items).where(items.c.expires_at <= now)
        return int(result.rowcount or 0)
