"""Triton kernels for atlas-lab's hot paths, imported as ``atlas_lab.kernels``.

Empty until the kernels land; ``memorize(..., impl="triton")`` raises a clear error meanwhile.
"""
