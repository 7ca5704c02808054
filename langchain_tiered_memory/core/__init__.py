"""Bottom layer: validation rules, the definition of a turn, optional-extra imports, exact JSON."""
