"""Tiers derived from the archive: window, compression, consolidation, long-term memory."""
