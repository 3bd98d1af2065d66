"""The build: metadata lives in pyproject.toml; this file is kept for what the build needs.

The package is pure Python: the C++/CUDA kernels in ``csrc/`` ship as package data (through
the ``attnmetrics/csrc`` link) and are JIT-compiled with ninja on first import. The models in
``models/`` are the subpackage ``attnmetrics.models`` (through the ``attnmetrics/models`` link).
"""

from setuptools import setup

setup()
