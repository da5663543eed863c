"""tilekiln runtime: load prebuilt GEMM bundles and run them. Never compiles.

    import tilekiln
    bundle = tilekiln.load("sm90a")        # an installed bundle, or a bundle directory
    c = bundle.gemm(a, b)                  # torch.matmul semantics
    c = tilekiln.gemm(a, b)                # picks the installed bundle for a's device
    print(tilekiln.explain(a, b))          # which kernel, and why

Imports only the standard library; torch is imported when torch tensors are
passed. The builder, the CuTe DSL, jinja2, pydantic and yaml are never imported.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tilekiln.errors import (BundleCompatibilityError, BundleError, BundleIntegrityError, LaunchError,
                             NoKernelError, TilekilnError)

__version__ = "0.5.0"
__all__ = ["load", "bundles", "gemm", "addmm", "linear", "swiglu", "swiglu_weight", "scaled_gemm", "grouped_gemm",
           "grouped_gemm_masked", "grouped_swiglu", "grouped_swiglu_masked", "explain", "Bundle", "TilekilnError",
           "BundleError", "BundleIntegrityError",
           "BundleCompatibilityError", "NoKernelError", "LaunchError", "quantize_fp8_blockwise"]


def load(path_or_name, *, trusted_keys=None):
    """A bundle by directory path or installed name (e.g. ``"sm90a"``); its files are verified
    first, and checked again on every call (docs/security.md).

    ``trusted_keys``: public keys (PEM text, or paths of files of them) of which one must have
    signed the bundle (``tilekiln sign``); ``TILEKILN_TRUSTED_KEYS`` names a file of keys that
    every load requires, this one included. Checking signatures needs ``cryptography``
    (``pip install 'tilekiln-runtime[signatures]'``).
    """
    from tilekiln.discovery import find, open_bundle

    path = Path(path_or_name)
    if path.is_dir():
        return open_bundle(path, trusted_keys)
    if isinstance(path_or_name, Path) or "/" in str(path_or_name):
        raise BundleError(f"{path_or_name}: no such bundle directory")
    return open_bundle(find(str(path_or_name)).directory, trusted_keys)


def bundles():
    """Every bundle this process can see (installed wheels and TILEKILN_BUNDLE_PATH)."""
    from tilekiln.discovery import installed

    return installed()


_default_lock = threading.Lock()
_default_for_device: dict[int, object] = {}


def _default_bundle(device: int):
    """The installed bundle for ``device``, opened once; ``TILEKILN_TRUSTED_KEYS`` applies to it as
    to every load."""
    bundle = _default_for_device.get(device)
    if bundle is not None:
        return bundle
    with _default_lock:
        if device in _default_for_device:
            return _default_for_device[device]
        from tilekiln._driver import compute_capability
        from tilekiln.compat import arch_runs_on, device_needs
        from tilekiln.discovery import describe_installed, installed, open_bundle
        from tilekiln.manifest import read_manifest

        cc = compute_capability(device)
        matches = []
        for loc in installed():
            m = read_manifest(loc.directory, verify=False)
            if arch_runs_on(m.arch_kind, m.compute_capability, cc):
                matches.append((m.arch_kind != "a", loc))  # exact-arch bundles before family ones
        if not matches:
            raise BundleCompatibilityError(
                f"no installed bundle runs on cuda:{device} (compute capability {cc[0]}.{cc[1]}; it needs a "
                f"bundle for {device_needs(cc)}). {describe_installed(cc)}")
        matches.sort(key=lambda t: t[0])
        bundle = _default_for_device[device] = open_bundle(matches[0][1].directory)
        return bundle


def _device_of(a) -> int:
    from tilekiln._tensors import describe, is_torch_tensor

    if is_torch_tensor(a):
        return a.get_device() if a.is_cuda else -1
    return describe(a, "a").device


def _bundle_for(a, bundle):
    """``bundle`` as a Bundle: loaded by name or path, or the default for ``a``'s device."""
    if bundle is None:
        device = _device_of(a)
        if device < 0:
            raise ValueError("a: tensor is in host memory; tilekiln runs on CUDA devices, move it with .cuda()")
        return _default_bundle(device)
    return bundle if hasattr(bundle, "gemm") else load(bundle)


def _torch_operands(a, b):
    """tilekiln._torch when ``a`` and ``b`` are torch tensors (importing it registers the operators)."""
    from tilekiln._tensors import is_torch_tensor

    if is_torch_tensor(a) and is_torch_tensor(b):
        from tilekiln.bundle import torch_path

        return torch_path()
    return None


def gemm(a, b, *, out=None, bundle=None, stream=None):
    """``a @ b`` (torch.matmul semantics for 2-D and batched 3-D operands) with a prebuilt kernel.

    ``bundle`` is a Bundle, a bundle name or directory; by default the installed
    bundle for ``a``'s device. Runs on ``stream`` (default: torch's current
    stream for torch tensors, the legacy default stream otherwise).
    Differentiable, and a single node under torch.compile (docs/runtime.md).
    """
    fast = _torch_operands(a, b)
    if fast is not None:
        return fast.gemm(bundle, a, b, out, stream)
    return _bundle_for(a, bundle).gemm(a, b, out, stream=stream)


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None, bundle=None):
    """``beta * input + alpha * (mat1 @ mat2)``, torch.addmm's semantics, with ``mat1`` (M, K) and ``mat2``
    (K, N) of one dtype and ``input`` of that dtype broadcastable to (M, N); ``beta`` and ``alpha``
    real numbers. beta 0 ignores ``input``, NaN and inf included, as torch does.

    Fused where a kernel of the bundle computes it (kernel field ``scalars: alphabeta``): ``input`` is
    the epilogue's residual where it is a full (M, N) tensor at the strides of ``out`` (or, without
    ``out``, of the contiguous result), so ``addmm(c, a, b, beta=b_, alpha=a_, out=c)`` updates ``c`` in
    place; otherwise the kernel computes ``alpha * (mat1 @ mat2)`` and torch adds ``beta * input`` in
    fp32, and where the bundle has no alpha and beta kernel torch applies both to the plain product
    (``explain(mat1, mat2, residual=input, alpha=, beta=)`` says which). Differentiable; one node under
    torch.compile; torch tensors (docs/runtime.md).
    """
    fast = _torch_operands(mat1, mat2)
    if fast is None:
        raise TypeError("addmm takes torch tensors (mat1 and mat2); the operands given are "
                        f"{type(mat1).__name__} and {type(mat2).__name__}")
    return fast.addmm(bundle, input, mat1, mat2, beta, alpha, out)


def linear(x, weight, bias=None, *, activation=None, residual=None, out=None, bundle=None):
    """``activation(F.linear(x, weight, bias)) + residual`` with ``x`` (..., K) and ``weight`` (N, K).

    ``bias``: None or a contiguous (N,) tensor of x's dtype or float32 on x's device, added before
    the activation. ``activation``: None, ``"relu"``, ``"silu"``, ``"gelutanh"`` (GELU's tanh form)
    or ``"geluerf"`` (exact GELU). The bias and the activation run in the GEMM's epilogue where a
    kernel of the bundle computes them (the bias alone where no kernel also has the activation);
    ``residual``: None or a tensor of the result's shape, added after the activation; it is fused
    too where a kernel adds one and the residual has x's dtype and the strides of ``out`` (or,
    without ``out``, of the contiguous result), so ``linear(x, w, residual=h, out=h)`` adds in
    place. Whatever no kernel fuses torch applies afterwards (``explain(..., bias=...,
    activation=..., residual=...)`` says which). The result has x's dtype. Differentiable
    (unfused when an input requires grad); torch tensors.
    """
    fast = _torch_operands(x, weight)
    if fast is None:
        raise TypeError("linear takes torch tensors (x and weight); the operands given are "
                        f"{type(x).__name__} and {type(weight).__name__}")
    return fast.linear(bundle, x, weight, bias, activation, residual, out)


def swiglu(x, w_gate_up, *, out=None, bundle=None):
    """``silu(x @ w_gate.T) * (x @ w_up.T)``, (..., I), with ``x`` (..., K) and ``w_gate_up`` the (2I, K)
    weight :func:`swiglu_weight` makes (gate and up rows interleaved in blocks of 64).

    One GEMM whose epilogue writes the product (the (..., 2I) intermediate is never stored) where a
    kernel of the bundle fuses it; otherwise the GEMM, then the product in torch
    (``explain(x, w_gate_up.t(), activation="swiglu")`` says which). The result has x's dtype.
    Differentiable (the backward recomputes the GEMM); torch tensors.
    """
    fast = _torch_operands(x, w_gate_up)
    if fast is None:
        raise TypeError("swiglu takes torch tensors (x and w_gate_up); the operands given are "
                        f"{type(x).__name__} and {type(w_gate_up).__name__}")
    return fast.swiglu(bundle, x, w_gate_up, out)


def swiglu_weight(w_gate, w_up=None):
    """The (2I, K) weight :func:`swiglu` takes, from ``w_gate`` and ``w_up`` (I, K) each (nn.Linear
    weights), or from one stacked ``[gate; up]`` (2I, K) weight: rows [gate 0:64, up 0:64, gate
    64:128, up 64:128, ...] (docs/runtime.md). Convert once, when the model is loaded."""
    from tilekiln.bundle import torch_path

    return torch_path().swiglu_weight(w_gate, w_up)


def scaled_gemm(a, b, scale_a, scale_b, *, bias=None, out_dtype=None, out=None, bundle=None, stream=None,
                scale_format=None, scale_result=None, activation=None):
    """fp8 ``(a @ b) * scale_a * scale_b + bias`` with bf16 output by default. Takes torch tensors.

    ``scale_format`` None (the default) reads the scales as ``torch._scaled_mm`` does: one-element
    float32 scales are per-tensor, (M, 1) and (1, N) ones row-wise, (M, K/128) and (ceil(N/128),
    K/128) ones blockwise. ``"tensor"``: per-tensor
    scales. ``"rowwise"``: 2-D ``a`` (M, K) and ``b`` (K, N), ``scale_a`` float32 (M, 1) and
    ``scale_b`` float32 (1, N), both contiguous: ``out[m, n] = (a @ b)[m, n] * scale_a[m] *
    scale_b[n]``, applied in fp32 in the epilogue. ``"blockwise"``: e4m3 ``a`` (M, K) row-major and
    ``b`` (K, N) K-major (an nn.Linear weight's ``.t()``), K a multiple of 128; ``scale_a`` float32
    (M, K/128) M-major, one per row and 128 K, and ``scale_b`` float32 (ceil(N/128), K/128) with
    K/128 contiguous, one per 128x128 block; :func:`quantize_fp8_blockwise` makes both
    (docs/runtime.md). ``"mxfp8"`` (the Blackwell and Rubin bundles): e4m3 ``a`` (M, K) and ``b``
    (K, N) K-major, K a multiple of 128; ``scale_a``/``scale_b`` float8_e8m0fnu, one per 32
    elements of a row of ``a`` / of ``b.t()``, in the tcgen05 layout that
    ``tilekiln.blockscaled.to_blocked`` makes from row-major (rows, K/32) scales
    (``tilekiln.blockscaled.quantize(x, "mxfp8")`` makes those). ``"nvfp4"`` and ``"mxfp4"``: e2m1
    ``a`` and ``b`` packed two per byte (torch.float4_e2m1fn_x2; ``a`` (M, K/2) row-major, ``b``
    (K/2, N) the transpose of a (N, K/2) weight), K in elements a multiple of 64 (nvfp4: e4m3 scales,
    float8_e4m3fn, one per 16) or 128 (mxfp4: e8m0 per 32), scales blocked as above
    (``tilekiln.blockscaled.quantize_operand(x, name)`` packs and scales). ``"fp4-e5m3-b32"`` (the
    Rubin bundle only): as mxfp4 with unsigned e5m3 scales per 32, passed as uint8 codes (torch has
    no e5m3 dtype; ``tilekiln.blockscaled.e5m3_codes``). ``bias``: None or a
    contiguous (N,) tensor of the result's type or float32, added after the scales, fused where a
    kernel adds it (else by torch; ``explain`` says which).
    ``out_dtype=torch.float8_e4m3fn`` (per-tensor or row-wise scales, no bias): the result for the
    next GEMM's input, ``saturate(value * scale_result)`` as torch._scaled_mm writes it, values past
    +-448 saturating to +-448; ``scale_result`` is then a one-element float32 tensor on the inputs'
    device (required; ``torch.ones(1, device=a.device)`` for none), and no other result takes one.
    ``activation="swiglu"``: ``b``'s N columns interleave gate and up in blocks of 64 (``b`` the
    transpose of a :func:`swiglu_weight` (2I, K) weight, for fp4 of its packed form), and the result
    is ``silu(gate) * up``, (M, N/2), of the scaled product (after the bias, if any), fused where a
    kernel computes it (the CC 10.x bundles' mxfp8 and nvfp4 ones, for I a multiple of 64), else
    paired by torch after the GEMM; not with an fp8 result."""
    fast = _torch_operands(a, b)
    if fast is None:
        raise TypeError("scaled_gemm takes torch tensors (a and b); the operands given are "
                        f"{type(a).__name__} and {type(b).__name__}")
    return fast.scaled_gemm(bundle, a, b, scale_a, scale_b, out_dtype, out, stream, None, scale_format, bias,
                            scale_result, activation)


def quantize_fp8_blockwise(x, block=(1, 128), *, power_of_two=False):
    """``(x_fp8, scales)``: ``x`` (R, C) as float8_e4m3fn with float32 scales per ``block`` (``(1, 128)``
    for activations, ``(128, 128)`` for weights) in the layout ``scaled_gemm(...,
    scale_format="blockwise")`` reads; ``power_of_two`` rounds each scale up to a power of two.
    Pure torch, on ``x``'s device (tilekiln/blockwise.py)."""
    from tilekiln.blockwise import quantize_fp8_blockwise as quantize

    return quantize(x, block, power_of_two=power_of_two)


def grouped_gemm(a, b, offs, *, scale_a=None, scale_b=None, out=None, bundle=None, stream=None, scale_format=None):
    """``torch._grouped_mm(a, b, offs=offs)``: a (total_M, K) with rows sorted by group, b (G, K, N) (pass
    nn.Linear-style (G, N, K) weights as ``w.transpose(1, 2)``), offs an int32 CUDA tensor of the G
    cumulative row ends; out (total_M, N). fp8 (e4m3) inputs take float32 scales and give bf16: per-tensor
    (one element each), or row-wise as ``torch._scaled_grouped_mm`` takes them, ``scale_a`` (total_M,) (or
    (total_M, 1)) one per row of a and ``scale_b`` (G, N) (or (G, 1, N)) one per group and column of b,
    both contiguous, applied to the fp32 accumulator in the epilogue. One launch, no host
    synchronization: it captures in a CUDA graph and replays with new offsets. The kernel clamps each
    end into [previous end, total_M]; rows past the last end are not written (docs/runtime.md).
    ``scale_format`` (the CC 10.x bundles): ``"mxfp8"``, ``"nvfp4"`` or another block-scaled format of
    ``scaled_gemm``, for quantized experts: a's and b's elements in that format (e2m1 packed two per byte
    along K, b a (G, N, K / 2) weight's ``.transpose(1, 2)``), K a multiple of 4 scale blocks, bf16
    result; ``scale_b`` ``tilekiln.blockscaled.to_blocked`` of the (G, N, K / block) weight scales and
    ``scale_a`` ``tilekiln.blockscaled.to_blocked_grouped(s, offs)`` of the (total_M, K / block)
    activation scales, each group's rows padded to a multiple of 128 (docs/runtime.md).
    ``scale_format="blockwise"`` (the sm90 bundles; the DeepSeek-V3 recipe, as ``scaled_gemm``'s): e4m3
    a and b, K a multiple of 128, bf16 result; ``scale_a`` float32 (total_M, K/128) M-major, one per row
    of a and 128 K (``quantize_fp8_blockwise(a, (1, 128))``), and ``scale_b`` float32 (G, ceil(N/128),
    K/128) with K/128 contiguous, one per group and 128x128 block of the (G, N, K) weight (each expert's
    ``quantize_fp8_blockwise(w[g], (128, 128))``, stacked); each K block's partial sum is promoted with
    its scales in fp32 (docs/runtime.md, "Blockwise fp8"); without ``scale_format``, scales of exactly
    these shapes (not row-wise ones) are read as blockwise. Takes torch tensors; not differentiable."""
    fast = _torch_operands(a, b)
    if fast is None:
        raise TypeError("grouped_gemm takes torch tensors (a and b); the operands given are "
                        f"{type(a).__name__} and {type(b).__name__}")
    return fast.grouped_gemm(bundle, a, b, offs, scale_a, scale_b, out, stream, scale_format=scale_format)


def grouped_gemm_masked(a, b, masked_m, *, scale_a=None, scale_b=None, out=None, bundle=None, stream=None,
                        scale_format=None):
    """The masked layout (DeepGEMM's, for decode under CUDA graphs): a (G, M_max, K), b (G, K, N),
    masked_m an int32 CUDA tensor of the G groups' row counts; ``out[g, :masked_m[g]] =
    a[g, :masked_m[g]] @ b[g]`` in out (G, M_max, N), whose other rows are not written. The kernel
    clamps each count into [0, M_max]. fp8, graphs and checks as ``grouped_gemm``; row-wise
    ``scale_a`` is (G, M_max) (or (G, M_max, 1)); with a block-scaled ``scale_format``, ``scale_a`` is
    ``tilekiln.blockscaled.to_blocked`` of the (G, M_max, K / block) activation scales; with
    ``scale_format="blockwise"``, ``scale_a`` is float32 (G, M_max, K/128) with M_max contiguous (stride
    (s_g, 1, s_k): ``quantize_fp8_blockwise(a.view(-1, K), (1, 128))[1].view(G, M_max, -1)``) and
    ``scale_b`` as ``grouped_gemm``'s."""
    fast = _torch_operands(a, b)
    if fast is None:
        raise TypeError("grouped_gemm_masked takes torch tensors (a and b); the operands given are "
                        f"{type(a).__name__} and {type(b).__name__}")
    return fast.grouped_gemm(bundle, a, b, masked_m, scale_a, scale_b, out, stream, masked=True,
                             scale_format=scale_format)


def grouped_swiglu(a, w_gate_up, offs, *, scale_a=None, scale_b=None, out=None, bundle=None, stream=None,
                   scale_format=None):
    """An expert MLP's gate_up projection: per group g, ``silu(a_g @ w_gate.T) * (a_g @ w_up.T)``, (total_M,
    I), with ``a`` and ``offs`` as ``grouped_gemm`` takes them and ``w_gate_up`` (G, 2I, K), each expert's
    gate and up rows interleaved in blocks of 64 (``swiglu_weight(w_gate, w_up)`` with (G, I, K) weights).
    One grouped GEMM whose epilogue writes the product (the (total_M, 2I) intermediate is never stored)
    where a kernel of the bundle fuses it; otherwise the grouped GEMM, then the product in torch, which
    then writes every row (rows no group owns as zeros; ``explain(a, w_gate_up.transpose(1, 2),
    offs=offs, activation="swiglu")`` says which). fp8 scales as ``grouped_gemm``'s, ``scale_b``'s columns
    being w_gate_up's rows (G, 2I); ``scale_format="blockwise"`` (the DeepSeek-V3 recipe) takes
    ``scale_b`` (G, 2I/128, K/128) of the interleaved weight (each expert's
    ``quantize_fp8_blockwise(swiglu_weight(w_gate, w_up)[g], (128, 128))``: a 128-row scale block holds
    one 64-row gate block and its up block). Graphs and checks as ``grouped_gemm``."""
    fast = _torch_operands(a, w_gate_up)
    if fast is None:
        raise TypeError("grouped_swiglu takes torch tensors (a and w_gate_up); the operands given are "
                        f"{type(a).__name__} and {type(w_gate_up).__name__}")
    return fast.grouped_swiglu(bundle, a, w_gate_up, offs, scale_a, scale_b, out, stream,
                               scale_format=scale_format)


def grouped_swiglu_masked(a, w_gate_up, masked_m, *, scale_a=None, scale_b=None, out=None, bundle=None,
                          stream=None, scale_format=None):
    """``grouped_swiglu`` in the masked layout: a (G, M_max, K), masked_m as ``grouped_gemm_masked`` takes
    it (and blockwise ``scale_a`` as it does), out (G, M_max, I), whose rows past each count the fused
    kernel does not write."""
    fast = _torch_operands(a, w_gate_up)
    if fast is None:
        raise TypeError("grouped_swiglu_masked takes torch tensors (a and w_gate_up); the operands given are "
                        f"{type(a).__name__} and {type(w_gate_up).__name__}")
    return fast.grouped_swiglu(bundle, a, w_gate_up, masked_m, scale_a, scale_b, out, stream, masked=True,
                               scale_format=scale_format)


def explain(a, b, *, out=None, bundle=None, backward=None, activation=None, bias=None, residual=None,
            scale_format=None, offs=None, masked_m=None, out_dtype=None, alpha=None, beta=None):
    """The kernel ``gemm`` would run for these operands, why, and why not the others; with
    ``backward`` (by default when an input requires grad), what the gradient's GEMMs run on; with
    ``activation`` (``"swiglu"`` for ``swiglu(x, w)``: pass ``x`` and ``w.t()``), ``bias`` (the bias
    tensor, or its type: ``"bf16"``, ``"f32"`` or a torch dtype) and ``residual`` (a residual tensor,
    or True), whether a kernel fuses them (as ``linear`` would ask; the residual fuses only where its
    strides are the result's, docs/runtime.md); with ``scale_format`` (``"rowwise"``,
    ``"blockwise"``, ``"mxfp8"``, ``"nvfp4"``, ``"mxfp4"``), the kernel ``scaled_gemm`` would run for
    fp8 (fp4) operands with such scales (``out_dtype``: its result type, bf16 by default, e.g.
    ``torch.float8_e4m3fn``, which implies per-tensor scales where ``scale_format`` is None); with
    ``offs`` (or ``masked_m``), the kernel ``grouped_gemm(a, b, offs)`` (``grouped_gemm_masked``)
    would run; with ``activation="swiglu"`` too, ``grouped_swiglu(a, w, offs)`` (pass ``a`` and
    ``w.transpose(1, 2)``), and with ``scale_format="rowwise"`` (``"blockwise"``) the row-wise (blockwise) scaled kernels, with
    ``"mxfp8"`` or ``"nvfp4"`` (and the other block-scaled formats) the block-scaled ones; with ``alpha`` or
    ``beta`` (numbers), the kernel ``addmm(input, a, b, beta=, alpha=)`` would run, ``residual`` saying
    whether input fuses (True, or the input tensor itself, whose strides must then be the result's), and
    where none computes alpha and beta, which kernel runs the product torch then scales."""
    from tilekiln._tensors import is_torch_tensor, torch_dtype_token
    from tilekiln.problem import requested_epilogue

    if offs is not None or masked_m is not None:
        masked = masked_m is not None
        act = "none" if activation is None else getattr(activation, "value", activation)
        if act not in ("none", "swiglu"):
            raise ValueError(f"activation: grouped kernels fuse 'swiglu' (or None), not {activation!r}")
        if scale_format in (None, "tensor", "rowwise", "blockwise"):
            requested = requested_epilogue(scaling=scale_format or "tensor", activation=act)
        else:
            # A block-scaled format (tilekiln/blockscaled.py) asks for its block scale.
            from tilekiln.blockscaled import block_request, grouped_block_format

            requested = requested_epilogue(**dict(block_request(grouped_block_format(scale_format))), activation=act)
        return _bundle_for(a, bundle).explain_grouped(a, b, masked_m if masked else offs, out, masked=masked,
                                                      requested=requested)
    bias_type = "none" if bias is None else torch_dtype_token(bias.dtype if is_torch_tensor(bias) else bias)
    act = "none" if activation is None else getattr(activation, "value", activation)
    asked = {"scaling": "tensor"}
    if scale_format is not None or out_dtype is not None:
        # Scaled calls take torch tensors: only they load the modules that import torch.
        from tilekiln.blockscaled import RUNTIME_BLOCK_FORMATS, block_request
        from tilekiln.blockwise import scale_format_token

        scaling = "tensor" if scale_format is None else scale_format_token(scale_format)
        scale_format = scaling
        # A block-scaled format asks for its block scale (tilekiln/blockscaled.py), the others for a scaling.
        asked = dict(block_request(scaling)) if scaling in RUNTIME_BLOCK_FORMATS else {"scaling": scaling}
    fused_residual = residual is not None and residual is not False
    if alpha is not None or beta is not None:
        return _explain_addmm(_bundle_for(a, bundle), a, b, out, residual, backward,
                              1.0 if beta is None else float(beta), 1.0 if alpha is None else float(alpha))
    requested = requested_epilogue(**asked, bias=bias_type, activation=act,
                                   residual="add" if fused_residual else "none")
    # A scaled (fp8) call's result is bf16 by default, as scaled_gemm's.
    if out is not None and is_torch_tensor(out):
        out_dtype = out.dtype
    out_dtype = None if scale_format is None else "bf16" if out_dtype is None else torch_dtype_token(out_dtype)
    return _bundle_for(a, bundle).explain(a, b, out, out_dtype, backward=backward, requested=requested)


def _explain_addmm(bundle, a, b, out, residual, backward, beta: float, alpha: float):
    """explain for ``addmm``: the kernel for its request (tilekiln/problem.py, addmm_request) and, where
    no kernel computes alpha and beta, the plain product's, with a note that torch applies them."""
    from dataclasses import replace

    from tilekiln._tensors import is_torch_tensor
    from tilekiln.problem import addmm_request

    fused = residual is True
    if is_torch_tensor(residual) and is_torch_tensor(a) and is_torch_tensor(b):
        from tilekiln._torch.results import allocate
        from tilekiln._torch.run import addmm_plan

        target = out if out is not None else allocate((a.shape[0], b.shape[1]), a.shape[1], a.dtype, a.device)
        fused = addmm_plan(residual, a, b, beta, alpha, target)[1] is not None
    requested = addmm_request(beta, alpha, fused)
    choice = bundle.explain(a, b, out, backward=backward, requested=requested)
    if choice.kernel is not None or ("scalars", "alphabeta") not in requested:
        return choice
    plain = bundle.explain(a, b, out, backward=backward)
    return replace(plain, notes=plain.notes + (f"unfused: no kernel computes alpha and beta; addmm runs "
                                               f"{plain.label} and torch applies them after it",))


def __getattr__(name: str):
    if name == "Bundle":
        from tilekiln.bundle import Bundle

        return Bundle
    raise AttributeError(name)
