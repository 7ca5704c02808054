"""``python -m langchain_tiered_memory.cli``: the ``tiered-memory`` command."""

from langchain_tiered_memory.cli.app import main

main()
