"""The torch path: tilekiln's entry points for torch tensors and the torch operators behind them.

Imported only when torch tensors are passed (tilekiln/bundle.py, ``torch_path``); importing it
imports torch and registers the operators. One module per step of a call:

    api.py          the entry points, and whether a call takes the hot path or an operator
    checks.py       the checks of arguments that are not scales
    scales.py       the checks of scales, and the epilogue a scaled call requests
    run.py          the hot path of the dense calls: plan look-up and launch
    run_grouped.py  the grouped calls: plan and launch
    results.py      the result tensor: allocation, and the stage an ``out=`` is written through
    epilogue.py     torch's definition of each epilogue (the unfused fallback, the references)
    ops.py          the torch operators, their fakes and autograd
    streams.py      the bundle an operator names, and the stream a call runs on
"""

from torch import Tensor

from tilekiln._torch.api import addmm, gemm, grouped_gemm, grouped_swiglu, linear, scaled_gemm, swiglu
from tilekiln._torch.epilogue import swiglu_weight

__all__ = ["Tensor", "addmm", "gemm", "grouped_gemm", "grouped_swiglu", "linear", "scaled_gemm", "swiglu",
           "swiglu_weight"]
