"""Text layer: token counting, lexical search (CJK-aware) and offline embeddings."""
