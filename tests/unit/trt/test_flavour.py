"""Flavour detection reads the installation without importing the builders."""

import importlib.util
import sys
from importlib import metadata

import pytest

from pipeline.toolchain.trt import flavour as fl


def test_installed_flavours_match_find_spec():
    expected = [f for f in fl.FLAVOURS if any(importlib.util.find_spec(m) for m in fl.MODULES[f])]
    assert fl.installed_flavours() == expected


def test_detection_does_not_import_the_bindings():
    fl.installed_flavours()
    fl.trt_version("tensorrt-rtx")
    # importing a flavour loads native libraries; detection must not (another test may have imported it already)
    if "tensorrt_rtx_bindings" not in sys.modules:
        assert "tensorrt_rtx" not in sys.modules


def test_auto_prefers_datacenter_then_rtx():
    installed = fl.installed_flavours()
    assert fl.resolve_flavour("auto") == (installed[0] if installed else None)


def test_explicit_flavour_passes_through_even_when_missing():
    assert fl.resolve_flavour("tensorrt") == "tensorrt"
    assert fl.resolve_flavour("tensorrt-rtx") == "tensorrt-rtx"
    with pytest.raises(ValueError, match="unknown TensorRT flavour"):
        fl.resolve_flavour("tensorrt-llm")


def test_version_comes_from_distribution_metadata():
    if fl.module_name("tensorrt-rtx") is None:
        assert fl.trt_version("tensorrt-rtx") is None
        return
    dists = metadata.packages_distributions()["tensorrt_rtx_bindings"]
    assert fl.trt_version("tensorrt-rtx") == metadata.version(dists[0])


def test_compute_capability_spelling_round_trips():
    assert fl.compute_capability_name(8, 9) == "sm89"
    assert fl.parse_compute_capability("sm89") == (8, 9)
    assert fl.parse_compute_capability("sm120") == (12, 0)
    assert fl.compute_capability_name(*fl.parse_compute_capability("sm121")) == "sm121"


def test_missing_flavour_import_names_the_pip_command():
    if fl.module_name("tensorrt") is not None:
        pytest.skip("datacenter TensorRT is installed here")
    with pytest.raises(ImportError, match=r"deploy-pipeline\[tensorrt\]"):
        fl.import_trt("tensorrt")
