"""Fixtures of the GPU tests: torch (imported only once a test runs) and the bundle under test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


@pytest.fixture(scope="module")
def bundle(gpu_bundle_dir):
    import tilekiln

    return tilekiln.load(gpu_bundle_dir)
