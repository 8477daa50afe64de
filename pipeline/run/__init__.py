"""The deploy itself: plan, executor, lanes, progress."""
