"""Renaissance: fused deep-learning optimizers with bit-identical CPU and CUDA backends.

The core module: the C++ Task API on numpy float32 arrays, the kind table, the built-in
layouts and replay cases (docs/python.md). There is no PyTorch adapter yet (issue 13).
"""
from ._core import Task, __version__, kinds, layout, layouts, replay, with_cuda

__all__ = ["Task", "__version__", "kinds", "layout", "layouts", "replay", "with_cuda"]
