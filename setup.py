"""The compiled pieces of ringcomm: the window's rounds (ringcomm/core/_round.c), the shm
transport's pipe for large sends (ringcomm/transport/shm/_pipe.c) and MPI_Init's deadline
(ringcomm/_deadline.c).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is found the
install still succeeds and ringcomm runs the same round in Python and sends large messages by
CMA, the staging pool or MPI (slower, same results); MPI_Init's deadline is then faulthandler's.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension(
        "ringcomm.core._round", ["ringcomm/core/_round.c"], optional=True,
        # No fused multiply-add and no reassociation: the round must round exactly as numpy does.
        extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=gnu11"],
        include_dirs=["ringcomm/core"], depends=["ringcomm/core/_polling.h", "ringcomm/core/_copy.h"],
    ),
    Extension("ringcomm._deadline", ["ringcomm/_deadline.c"], optional=True, extra_compile_args=["-O2", "-std=gnu11"]),
    Extension("ringcomm.transport.shm._pipe", ["ringcomm/transport/shm/_pipe.c"], optional=True,
              extra_compile_args=["-O3", "-std=gnu11"],
              include_dirs=["ringcomm/core"], depends=["ringcomm/core/_polling.h", "ringcomm/core/_copy.h"]),
])
