"""Text layer: token counting, lexical search (CJK-aware), vector similarity, offline embeddings."""
