"""Optional dependencies: import them on first use, or say which extra installs them."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType


def import_extra(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module``, or raise an ``ImportError`` naming the extra to install.

    Args:
        module: The module to import, e.g. ``"chromadb"``.
        extra: This package's extra that provides it, e.g. ``"chroma"``.
        feature: What needs it, for the message, e.g. ``"ChromaLongMemory"``.
    """
    try:
        return import_module(module)
    except ImportError as exc:
        msg = f"{feature} needs the {extra!r} extra: pip install 'langchain-tiered-memory[{extra}]'"
        raise ImportError(msg) from exc
