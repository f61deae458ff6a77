"""ampfix: find and fix mixed-precision mistakes in PyTorch training code."""

__version__ = "0.1.0"
