"""attnmetrics: is attention explanation? Faithfulness metrics with a C++ core.

Pure-Python install: the C++ kernels in ``csrc/`` ship as package data (through the
``attnmetrics/csrc`` symlink) and are JIT-compiled with ninja on first import.
"""

from setuptools import setup

setup(
    name="attnmetrics",
    version="0.1.0",
    description="Attention faithfulness metrics (Jain & Wallace; Wiegreffe & Pinter; "
    "Serrano & Smith; Tutek & Snajder) with a C++ core",
    python_requires=">=3.10",
    packages=["attnmetrics", "attnmetrics_models"],
    package_dir={"attnmetrics_models": "models"},
    package_data={"attnmetrics": ["csrc/*.cpp", "csrc/*.h", "csrc/*/*.cpp", "csrc/*/*.h", "csrc/*/*.cu"]},
    install_requires=[
        "torch>=2.4",
        "numpy",
        "scipy",
        "ninja",
        "matplotlib",
        "tqdm",
        "tabulate",
        "scikit-learn",
        "pyarrow",
    ],
    extras_require={"test": ["pytest", "pytest-benchmark", "hypothesis"]},
    entry_points={"console_scripts": ["attnmetrics = attnmetrics_models.cli:main"]},
)
