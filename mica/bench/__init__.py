"""The PyTorch side of side-by-side comparisons (torch is an optional, test/benchmark dependency)."""
