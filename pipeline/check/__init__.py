"""Accuracy: comparisons against the reference, divergence, and typed readers of the results."""
