# Two entry points that work on a fresh machine with only Python 3.11 and make:
#   make demo   set up .venv if needed, train a small transformer with DDP under mpirun -n 2, then
#               the same short run on the ringcomm, mpi and gloo backends side by side
#   make test   set up .venv if needed, then run the whole test suite
#   make torch-tests  torch's own distributed tests (DistributedTest._DistTestBase) on gloo and
#               on ringcomm at 2 and 3 ranks, compared (about 15 minutes on 2 cores: not in make test)
#   make soak   30,000 random calls on 4 ranks in a 64 MiB /dev/shm (needs root for unshare)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup demo test torch-tests soak clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Pinned exactly: this CPU build lies on local disk; a looser pin pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,plot]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/mpirun -n 2 $(PY) examples/train.py --backend ringcomm
	$(VENV)/bin/mpirun -n 2 $(PY) examples/compare_backends.py

test: setup
	$(PY) -m pytest -q -ra --durations=15

torch-tests: setup
	$(PY) tests/torch_suite/run.py --sizes 2,3

# Every result checked, bitwise equal across ranks; then /dev/shm must hold nothing of ringcomm's.
SOAK_CALLS ?= 30000
soak: setup
	unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 1; \
	  PATH=$(abspath $(VENV))/bin:$$PATH PYTHONPATH=$(CURDIR) RINGCOMM_TIMEOUT=300 \
	  mpirun -n 4 $(abspath $(PY)) tests/mpi_jobs/soak.py $(SOAK_CALLS) 7; rc=$$?; \
	  left=$$(ls /dev/shm | grep ringcomm); echo "left in /dev/shm: $${left:-nothing}"; \
	  test $$rc -eq 0 && test -z "$$left"'

clean:
	rm -rf $(VENV) build *.egg-info
