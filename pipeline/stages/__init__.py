"""One module per stage; the plan that orders them is pipeline/plan.py."""
