"""Silt from Python.

``silt.filesystem(...)`` (or ``fsspec.filesystem("silt", ...)``) gives an fsspec filesystem
over the Silt client: attached to the local ``silt up``, joined to a cluster, or embedded in
this process.  ``silt.torch`` has PyTorch datasets, a cache-aware sampler and checkpoint
helpers (importable without torch).  See docs/python.md.
"""

from silt._native import __version__
from silt.fs import SiltFileSystem, filesystem

__all__ = ["SiltFileSystem", "filesystem", "__version__"]


def __getattr__(name):
    # `silt.torch` without importing torch until it is used.
    if name == "torch":
        import importlib

        return importlib.import_module("silt.torch")
    raise AttributeError(f"module 'silt' has no attribute {name!r}")
