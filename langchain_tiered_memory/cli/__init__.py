"""Command line: the typer app, its store, rendering and the offline demo (top layer)."""
