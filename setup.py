"""The one compiled piece of ringcomm: the window's rounds (ringcomm/core/_round.c).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is found the
install still succeeds and ringcomm runs the same round in Python (slower, same results).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "ringcomm.core._round", ["ringcomm/core/_round.c"], optional=True,
    # No fused multiply-add and no reassociation: the round must round exactly as numpy does.
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=gnu11"],
)])
