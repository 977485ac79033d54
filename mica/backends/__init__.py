"""Backends turn a Program into results: `reference` interprets it in numpy (the oracle)."""
