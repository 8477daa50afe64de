"""Checks of the recipe against the world, before any work starts."""
