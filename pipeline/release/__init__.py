"""What outlives a deploy: the version store, manifest, Triton and MLflow hand-offs, compare."""
