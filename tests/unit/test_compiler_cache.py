"""The deploy pins TorchInductor's cache where TorchInductor itself would put it, worked out without importing
TorchInductor (pipeline/run/deploy.py): the two must agree, or compiled kernels land in another folder."""

from __future__ import annotations

import os

import pytest

from pipeline.run.deploy import _keep_compiler_cache


def test_the_compiler_cache_is_torchinductors_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    _keep_compiler_cache()
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()


def test_a_cache_folder_the_user_chose_stays(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    _keep_compiler_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
