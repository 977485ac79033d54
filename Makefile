# The two commands a user needs: `make test` (every test) and, later, `make train`.
# Both build the virtual environment from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
