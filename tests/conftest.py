"""Shared fixtures. GPU tests are marked ``gpu`` and skipped when PyTorch sees no CUDA device."""

from __future__ import annotations

import shutil

import pytest

import kernelbook as kb

HAS_GPU = kb.gpu() is not None
HAS_NVCC = shutil.which("nvcc") is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs the CUDA toolkit (nvcc)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "compile" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)
