"""Silt from Python.

``silt.filesystem(...)`` (or ``fsspec.filesystem("silt", ...)``) gives an fsspec filesystem
over the Silt client: attached to the local ``silt up``, joined to a cluster, or a single node
in this process.  ``silt.torch`` has PyTorch datasets, a cache-aware sampler and checkpoint
helpers (importable without torch).  See docs/python.md.
"""

from silt._native import __version__


class InvalidArgument(OSError, ValueError):
    """A call Silt refuses as given: a bad option, URL or mode, or a file system call that
    is EINVAL (a directory moved into itself, a name a store cannot hold). Both an
    ``OSError`` with ``errno.EINVAL``, as ``os`` raises for such calls, and a ``ValueError``,
    as for any bad argument (``io.UnsupportedOperation`` is the same pair)."""


from silt.fs import SiltFileSystem, filesystem  # noqa: E402 (after InvalidArgument: fs uses the native module)

__all__ = ["SiltFileSystem", "filesystem", "InvalidArgument", "__version__"]


def __getattr__(name):
    # `silt.torch` without importing torch until it is used.
    if name == "torch":
        import importlib

        return importlib.import_module("silt.torch")
    raise AttributeError(f"module 'silt' has no attribute {name!r}")
