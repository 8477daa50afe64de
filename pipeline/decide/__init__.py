"""Which artifact wins, and whether the release signs off."""
