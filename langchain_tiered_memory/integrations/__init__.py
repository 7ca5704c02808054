"""Entry points on top of the memory: chain, classic memory, agent middleware, knowledge docs."""
