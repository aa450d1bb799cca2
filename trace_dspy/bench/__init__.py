"""Layer 9, benchmarks: quality, cost and validity measurements whose JSON records back docs/."""
