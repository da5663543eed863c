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


@pytest.fixture(scope="module")
def opcheck(torch):
    """``torch.library.opcheck(op, args)``; with a float8 argument, without its test_schema, which
    compares the inputs before and after the call with torch.allclose, and torch 2.11 has no
    float8 allclose on CUDA."""
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    rest = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

    def check(op, args):
        if any(getattr(t, "dtype", None) in fp8 for t in args):
            return torch.library.opcheck(op, args, test_utils=rest)
        return torch.library.opcheck(op, args)

    return check
