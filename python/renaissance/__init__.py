"""Renaissance: fused deep-learning optimizers with bit-identical CPU and CUDA backends.

The core module: the C++ Task API on numpy float32 arrays, the kind table, the built-in
layouts and replay cases (docs/python.md). The PyTorch optimizers are `renaissance.torch`,
imported on first use only (importing renaissance does not import torch).
"""
from ._core import Task, __version__, combine_fingerprints, hyperparameters, kinds, layout, layouts, replay, with_cuda

__all__ = ["Task", "__version__", "combine_fingerprints", "hyperparameters", "kinds", "layout", "layouts", "replay", "with_cuda"]


def __getattr__(name):
    # `renaissance.torch` after a plain `import renaissance`, without importing torch up front.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'renaissance' has no attribute %r" % name)
