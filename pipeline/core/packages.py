"""Installed package versions, for the environment keys of fingerprints and the reports."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys


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


def on_import_path(folder: str) -> bool:
    """Whether `folder` is on this process's import path (an empty entry is the working folder)."""
    here = os.path.realpath(folder)
    return any(os.path.realpath(p or os.curdir) == here for p in sys.path)
