# The Makefile only forwards: the CLI (python -m pipeline) resolves recipes and owns exit codes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
RECIPE ?= bert.yaml
ARGS ?=
# optional extras: triton (tritonclient, for the Triton config test), mlflow (mlflow-skinny, run records),
# openvino (the opt-in openvino-cpu runtime), load (MLPerf LoadGen, for the server scenario), serve (PyTriton),
# fleet (Ray, for python -m pipeline fleet)
EXTRAS ?= cpu,dev,tensorrt-rtx,triton,mlflow,openvino,load,serve,fleet

.PHONY: setup deploy plan validate test test-quick test-gpu lint clean bytecode

setup:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# CPU torch first, exactly pinned, so that no later requirement can pull a multi-GB CUDA build.
	@$(PY) -m pip install -q "torch==$(TORCH_VERSION)" \
	  || { echo "make setup: could not install the CPU wheel torch==$(TORCH_VERSION); install it by hand (pip install torch==$(TORCH_VERSION)) and re-run" >&2; exit 1; }
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$(TORCH_VERSION)') and not torch.version.cuda else 1)" \
	  || { echo "make setup: installed torch is not the $(TORCH_VERSION) CPU build" >&2; exit 1; }
	@$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@echo "setup done: $(VENV) ($$($(PY) -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)'))"

deploy:
	$(PY) -m pipeline deploy $(RECIPE) $(ARGS)

plan:
	$(PY) -m pipeline plan $(RECIPE) $(ARGS)

validate:
	$(PY) -m pipeline validate $(RECIPE) $(ARGS)

# Bytecode written once: where PYTHONDONTWRITEBYTECODE is set (CI), every deploy a test starts would otherwise
# compile the project's modules again (0.4 s of CPU each, a few hundred times a run).
bytecode:
	@$(PY) -m compileall -q pipeline tests

# Two pytest workers, a test file each at a time (module fixtures deploy once): most tests wait on deploys in
# child processes; the zoo runs two of its deploys at a time.
test: bytecode
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not gpu" --durations=15 tests

# The unit tests and one deploy of the tiny recipe: a few minutes, for the daily loop.
test-quick: bytecode
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not gpu and not slow" tests/unit \
	  tests/integration/test_deploy_cli.py::test_first_deploy_signs_off_and_writes_the_contract

test-gpu:
	$(PY) -m pytest -q -m gpu tests

lint:
	$(VENV)/bin/ruff check pipeline tests scripts
	$(VENV)/bin/ruff format --check pipeline tests scripts

clean:
	rm -rf artifacts .pytest_cache .ruff_cache
