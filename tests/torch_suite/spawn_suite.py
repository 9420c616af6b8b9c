"""torch's own distributed tests (``DistributedTest._DistTestBase``), unchanged, on BACKEND.

The shape of torch's test/distributed/test_distributed_spawn.py: ``TestDistBackend`` starts
WORLD_SIZE processes (MultiProcessTestCase) that rendezvous through a file (INIT_METHOD,
file:// by default) and run one test body each. Importing ringcomm registers the "ringcomm"
backend in every rank (the ranks import this module to find the test class).

**Which tests.** torch picks its tests by backend name when distributed_test is imported:
decorators such as ``require_backend_is_available({"gloo"})`` or "get_future is only supported
on mpi, nccl and gloo" skip every other name. To run the list torch runs for gloo on a CPU
machine against another backend, the module is imported as for "gloo" and its ``BACKEND`` (what
each rank passes to ``init_process_group``, and what bodies branch on) is then set to the
backend under test. The bodies are torch's, unchanged. Also:

- ``PROFILING_SUPPORTED_BACKENDS`` and its send/recv twin list the backends whose profiler
  ranges the bodies check; the backend under test is added, so they are checked, not skipped.
- ``SUITE_SUBGROUPS=1``: torch runs its sub-group tests (groups [1, 2] of the world) only at 8
  ranks or more (``skip_if_small_worldsize``); this runs them from 3 ranks on.
- ``SUITE_START=fork``: ranks are forked from this process instead of spawned (the harness's
  own ``_start_processes`` with a fork context), which saves each rank seconds of imports.

tests/torch_suite/run.py runs the list on gloo and ringcomm and compares (make torch-tests).
"""
import os
import sys

import torch

import ringcomm  # noqa: F401  - registers the torch.distributed backend "ringcomm"
from torch.testing._internal import common_distributed

TESTED = os.environ["BACKEND"]
START = os.environ.get("SUITE_START", "spawn")   # or "fork"

if os.environ.get("SUITE_SUBGROUPS") == "1":
    _small = common_distributed.skip_if_small_worldsize

    def _needs_three(func):
        import functools

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if int(os.environ["WORLD_SIZE"]) < 3:
                sys.exit(common_distributed.TEST_SKIPS["small_worldsize"].exit_code)
            return func(*args, **kwargs)
        return wrapper
    common_distributed.skip_if_small_worldsize = _needs_three

os.environ["BACKEND"] = "gloo"   # select gloo's list (module doc)
try:
    from torch.testing._internal.common_utils import run_tests
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend
finally:
    os.environ["BACKEND"] = TESTED
distributed_test.BACKEND = TESTED
for allowlist in (distributed_test.PROFILING_SUPPORTED_BACKENDS, distributed_test.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
    if TESTED not in allowlist:
        allowlist.append(TESTED)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            # Ranks forked from this process: the same harness, without each rank spending
            # seconds importing torch's test modules again (this process has started no threads
            # of torch's or ringcomm's own: it never joins a process group).
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


if __name__ == "__main__":
    sys.exit(run_tests())
