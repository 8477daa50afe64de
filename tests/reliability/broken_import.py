"""A model module that fails to import (a user's syntax-level or dependency mistake)."""

raise ImportError("No module named 'some_missing_dependency'")
