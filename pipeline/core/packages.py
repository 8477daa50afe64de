"""Installed package versions, for the environment keys of fingerprints and the reports."""

from __future__ import annotations

import functools
import importlib.util


@functools.cache
def package_version(name: str) -> str | None:
    """Version of an installed distribution or module, None when absent (for environment keys)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed(module: str) -> bool:
    """Whether `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
