"""Build of the compiled single-player core (``mortal.features.sp._core``); metadata lives in pyproject.toml.

``scripts/setup.sh`` runs ``python setup.py build_ext --inplace``, which rebuilds
only when a source or header is newer than the built module. Needs a C++17
compiler and the Python headers; the build is optional (see mortal.features.obs_v4).
"""

from pathlib import Path

from setuptools import Extension, setup

CSRC = Path("mortal/features/sp/csrc")

setup(
    ext_modules=[
        Extension(
            "mortal.features.sp._core",
            sources=[str(CSRC / "core.cpp")],
            depends=[str(p) for p in sorted(CSRC.glob("*.hpp"))],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3", "-pthread"],
            extra_link_args=["-pthread"],
            # without a compiler the install still succeeds for versions 1-3; a version-4 process
            # then stops at start-up naming the fix (mortal.entry, mortal-doctor)
            optional=True,
        ),
        # the Brain's first convolution from the nonzero inputs on the CPU (inference and the learner's weight
        # gradient, docs/performance_forward.md); without it the dense convolution runs
        Extension(
            "mortal.model._stem",
            sources=["mortal/model/csrc/stem.cpp"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3"],
            optional=True,
        ),
    ],
)
