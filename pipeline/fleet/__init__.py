"""A release across many recipes and targets: each (recipe, target) deploy is a Ray task on a node that has the
target's resources, running the same `python -m pipeline deploy` a person runs, into one shared store."""
