"""One module per stage; the plan that orders them is pipeline/run/plan.py."""
