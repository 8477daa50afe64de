"""Installed package versions, for the environment keys of fingerprints and the reports."""

from __future__ import annotations

import functools


@functools.cache
def package_version(name: str) -> str | None:
    """Version of an installed distribution or module, None when absent (for environment keys)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
