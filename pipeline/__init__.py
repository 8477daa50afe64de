"""Model export-and-deploy pipeline: recipe -> exports -> validation -> benchmark -> signed-off version."""

__version__ = "0.1.0"
