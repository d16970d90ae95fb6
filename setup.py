"""Build of the compiled single-player core (``mortal.sp._core``); metadata lives in pyproject.toml.

``scripts/setup.sh`` runs ``python setup.py build_ext --inplace``, which rebuilds
only when a source or header is newer than the built module.
"""

from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("mortal/sp/csrc")

setup(
    ext_modules=[
        Extension(
            "mortal.sp._core",
            sources=[str(CSRC / "core.cpp")],
            depends=[str(p) for p in sorted(CSRC.glob("*.hpp"))],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ],
)
