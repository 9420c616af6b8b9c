# Two entry points that work on a fresh machine with only Python 3.11 and make:
#   make demo   set up .venv if needed, then train a small transformer with DDP under mpirun -n 2
#   make test   set up .venv if needed, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup demo test clean

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

test: setup
	$(PY) -m pytest -q -ra

clean:
	rm -rf $(VENV) build *.egg-info
