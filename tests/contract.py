"""Keys the output contract (docs/architecture.md) fixes, asserted by the tests that read reports."""

SPEED_ROW_KEYS = frozenset(
    {
        "artifact",
        "runtime",
        "io",
        "batch",
        "shapes",
        "n",
        "mean_ms",
        "p50_ms",
        "p90_ms",
        "p95_ms",
        "p99_ms",
        "min_ms",
        "max_ms",
        "cv",
        "p50_ci95_ms",
        "stable",
    }
)
