"""Storage layer: the archive (SQL or session files), its schema, and the durable job queue."""
