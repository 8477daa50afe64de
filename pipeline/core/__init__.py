"""The small kernel every phase shares: variant and runtime names, the host probe, errors, files, children."""
