# aisaac: run and test commands. `make help` lists them.
# Every target that runs code first runs `setup`, which is quick once done.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENV      ?= .venv
TORCH     ?= torch==2.13.0
# Optional pip index for torch, e.g. https://download.pytorch.org/whl/cpu on a machine
# whose pip would otherwise pick a multi-GB CUDA build.
TORCH_INDEX ?=
DATA_DIR  ?= /usr/share/datasets/fashion-mnist
TEXT_DIR  ?= /usr/share/games/fortunes
WORDNET_DIR ?= /usr/share/wordnet
N_WORKERS ?= 2
DEMO_ARGS ?=
# Options for pytest in `make pytest`, and a marker expression that selects the tests (`make test-fast`: PYTEST_MARK="not slow").
# The tests marked `serial` (2 processes at once: torchrun) run one at a time after the others, which run on PYTEST_WORKERS
# processes (pytest-xdist; 1: none).
PYTEST_ARGS ?=
PYTEST_MARK ?=
PYTEST_WORKERS ?= 2
# The notebooks that tests/test_notebooks.py runs in a Jupyter kernel and checks against their saved outputs (its FAST):
# `make test` (SKIP_KERNEL_NBS=1) leaves them to it rather than running them twice; `make nbtest` and `make test-fast` run them.
KERNEL_NBS ?= ^(callbacks|custom_callbacks|coming_from_pytorch_accelerated|coming_from_nanogpt)\.ipynb$$
# The tutorials whose fast variants train longest (the language model, fine-tuning, post-training and vision: about 150 s of
# the 2 workers' 350 s): `make test` runs them; `make test-fast` (SKIP_LONG_NBS=1) leaves them out, as it leaves out the slow tests.
LONG_NBS ?= ^(language_model|fine_tuning|post_training|vision)\.ipynb$$
NBTEST_ARGS ?=
# What `make docs` runs: notebooks or folders (default: every notebook in nbs/), and options for
# scripts/run_nbs.py (e.g. RUN_ARGS="-j 2" or "--skip-slow"); LAB_ARGS go to `jupyter lab`.
NBS       ?=
RUN_ARGS  ?=
LAB_ARGS  ?=
# The extras installed into .venv: `dev` (nbdev, pytest...) and the optional packages the tests need
# (`docs`: nbclient and ipykernel, to run the notebooks in a real Jupyter kernel).
EXTRAS    ?= dev,docs,text,tensorboard,mlflow,onnx,accelerate,transformers,wandb,peft,stateful
# Pages of the rendered site that `make shots` screenshots (paths relative to _docs/).
PAGES     ?= index.html tutorials/callbacks.html trainer.html

BIN   := $(VENV)/bin
PY    := $(BIN)/python
STAMP := $(VENV)/.aisaac-installed

.PHONY: help setup venv data text wordnet docs-tools demo test test-fast test-invariants check-export check-readme nbtest pytest docs-check slow export readme clean bench docs site shots lab

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

setup: venv data text wordnet docs-tools ## create .venv, install CPU torch then aisaac[dev,docs...], check the data, the text corpus, WordNet and pandoc

# The venv is (re)installed when it is missing or incomplete, or when pyproject.toml or the
# torch pin changed. The stamp holds a hash of those (nbdev-export rewrites pyproject.toml
# with the same content, so its modification time cannot be used).
venv:
	@want="$$(cat pyproject.toml | md5sum | cut -d' ' -f1) $(TORCH) $(TORCH_INDEX) $(EXTRAS)"; \
	if [ -x "$(PY)" ] && [ -f "$(STAMP)" ] && [ "$$(cat "$(STAMP)")" = "$$want" ]; then exit 0; fi; \
	if [ ! -x "$(PY)" ] || ! "$(PY)" -m pip --version >/dev/null 2>&1; then \
	  echo ">>> creating $(VENV) with $$($(PYTHON) --version)"; \
	  rm -rf "$(VENV)"; $(PYTHON) -m venv "$(VENV)"; \
	fi; \
	rm -f "$(STAMP)"; \
	echo ">>> installing $(TORCH) (CPU build) first, so that no CUDA build is pulled in"; \
	"$(PY)" -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"; \
	echo ">>> installing aisaac in editable mode with the extras $(EXTRAS)"; \
	"$(PY)" -m pip install -q -e ".[$(EXTRAS)]"; \
	echo "$$want" > "$(STAMP)"

# The `elif` branch that installs a Debian package when apt-get is usable (as root, or with sudo): $(call apt_elif,who,package,what if it fails)
apt_elif = elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; }; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); echo ">>> $(1): installing $(2) with apt-get"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(2) || echo "!!! $(1): apt-get failed; $(3)";

data: ## make sure Fashion-MNIST is available (Debian package dataset-fashion-mnist)
	@if [ -n "$${AISAAC_DATA:-}" ]; then \
	  echo ">>> data: using AISAAC_DATA=$$AISAAC_DATA"; \
	elif [ -d "$(DATA_DIR)" ]; then \
	  echo ">>> data: found $(DATA_DIR)"; \
	$(call apt_elif,data,dataset-fashion-mnist,load_fashion_mnist() will try the Hugging Face hub) \
	else \
	  echo "!!! data: $(DATA_DIR) is missing and apt-get is not usable here;"; \
	  echo "    set AISAAC_DATA to a folder with the Fashion-MNIST IDX files, or let"; \
	  echo "    load_fashion_mnist() download them from the Hugging Face hub."; \
	fi

text: ## make sure the text corpus is available (Debian package fortunes: 2.6 MB of English, BSD licence)
	@if [ -n "$${AISAAC_TEXT:-}" ]; then \
	  echo ">>> text: using AISAAC_TEXT=$$AISAAC_TEXT"; \
	elif [ -f "$(TEXT_DIR)/fortunes" ]; then \
	  echo ">>> text: found $(TEXT_DIR)"; \
	$(call apt_elif,text,fortunes,the language-model tutorial and tests need a text corpus (AISAAC_TEXT)) \
	else \
	  echo "!!! text: $(TEXT_DIR) is missing and apt-get is not usable here;"; \
	  echo "    set AISAAC_TEXT to a folder of fortune files (texts separated by lines holding %)."; \
	fi

wordnet: ## make sure WordNet is available (Debian package wordnet-base: WordNet 3.0, 28 MB, Princeton's WordNet licence)
	@if [ -n "$${AISAAC_WORDNET:-}" ]; then \
	  echo ">>> wordnet: using AISAAC_WORDNET=$$AISAAC_WORDNET"; \
	elif [ -f "$(WORDNET_DIR)/data.noun" ]; then \
	  echo ">>> wordnet: found $(WORDNET_DIR)"; \
	$(call apt_elif,wordnet,wordnet-base,the fine-tuning tutorial needs WordNet (AISAAC_WORDNET)) \
	else \
	  echo "!!! wordnet: $(WORDNET_DIR) is missing and apt-get is not usable here;"; \
	  echo "    set AISAAC_WORDNET to a folder holding WordNet 3's data.noun, data.verb, data.adj and data.adv."; \
	fi

# The docs check renders pages with Quarto when it is installed, otherwise with pandoc (Debian package `pandoc`).
docs-tools: ## make sure pandoc (or Quarto) is there to render the docs pages, and chromium to check them
	@if command -v quarto >/dev/null 2>&1; then echo ">>> docs: found quarto"; \
	elif command -v pandoc >/dev/null 2>&1; then echo ">>> docs: found pandoc"; \
	$(call apt_elif,docs,pandoc,install pandoc (or Quarto) yourself: the docs check cannot render pages without one) \
	else \
	  echo "!!! docs: neither quarto nor pandoc is installed and apt-get is not usable here:"; \
	  echo "    install pandoc (https://pandoc.org/installing.html) or Quarto (https://quarto.org);"; \
	  echo "    until then \`make docs-check\` processes the notebooks but renders no page (and fails under CI)."; \
	fi
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; then \
	  echo ">>> docs: found chromium (the docs check measures the code blocks and tries the search in it)"; \
	$(call apt_elif,docs,chromium,install chromium yourself: the docs check cannot measure the pages without it (and fails under CI)) \
	else echo "!!! docs: no chromium and apt-get is not usable: \`make docs-check\` will not measure the pages (and fails under CI)"; fi

demo: setup ## train the tutorial's model on full Fashion-MNIST (3 epochs), save out/loss.png
	$(PY) scripts/demo.py $(DEMO_ARGS)

test: setup ## all tests: export and README checks, nbdev-test on every notebook, pytest, then the docs check
	@$(MAKE) --no-print-directory check-export
	@$(MAKE) --no-print-directory check-readme
	@$(MAKE) --no-print-directory nbtest SKIP_KERNEL_NBS=1
	@$(MAKE) --no-print-directory pytest
	@$(MAKE) --no-print-directory docs-check

# The contributor's loop: what `test` runs but the tests that start other processes (torchrun runs, fresh Pythons, the
# tutorials in a Jupyter kernel: tests/conftest.py marks them `slow`), the long tutorials (LONG_NBS) and the docs check. `make test`
# stays the full check.
test-fast: setup ## the quick loop: export and README checks, nbdev-test on every notebook but the long tutorials, pytest -m "not slow"
	@$(MAKE) --no-print-directory check-export
	@$(MAKE) --no-print-directory check-readme
	@$(MAKE) --no-print-directory nbtest SKIP_LONG_NBS=1
	@$(MAKE) --no-print-directory pytest PYTEST_MARK='not slow'

# The invariance harness (issue 51): every pair of the catalogue's callbacks under every invariant that applies to both (the
# pairwise design of aisaac.coverage), each known defect checked to still fail; `make pytest` runs only its seeded sample.
test-invariants: setup ## every pair of the catalogue's callbacks under every invariant (resume, accumulation, graphs, records, transactions, hand)
	OMP_NUM_THREADS=1 AISAAC_FULL_INVARIANTS=1 $(BIN)/pytest -q -p no:xdist -s tests/test_invariants.py -k full_design

# nbdev-export must leave aisaac/ unchanged: the modules are generated from nbs/.
check-export: venv
	@before=$$(find aisaac -type f -name '*.py' | sort | xargs md5sum); \
	$(BIN)/nbdev-export; \
	after=$$(find aisaac -type f -name '*.py' | sort | xargs md5sum); \
	ok=1; [ "$$before" = "$$after" ] || ok=0; \
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git diff --quiet -- aisaac/ || ok=0; \
	fi; \
	if [ $$ok = 0 ]; then \
	  echo "!!! aisaac/ is out of sync with nbs/: nbdev-export changed it (or it differs from what git has staged/committed)."; \
	  git status --short -- aisaac/ 2>/dev/null || true; \
	  echo "    Fix: run 'make export' and commit nbs/ together with aisaac/."; \
	  exit 1; \
	fi; \
	echo ">>> nbdev-export: aisaac/ is in sync with nbs/"

# README.md holds the same text as nbs/index.ipynb, CONTRIBUTING.md as nbs/guides/contributing.ipynb (no Quarto here for nbdev-readme).
check-readme: venv
	$(PY) scripts/readme_sync.py --check

# What nbtest leaves out: one regular expression (`a|b`) of the groups asked for.
NBTEST_SKIP = $(subst $(space),|,$(strip $(if $(SKIP_KERNEL_NBS),$(KERNEL_NBS)) $(if $(SKIP_LONG_NBS),$(LONG_NBS))))
space := $(subst ,, )

nbtest: venv ## run every notebook in nbs/ with nbdev-test (slow cells skipped); one torch thread per worker (2 workers of 2 threads each on 2 cores took 136 s, of 1 thread 91 s)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) scripts/nbtest.py --n-workers $(N_WORKERS) --timing $(if $(NBTEST_SKIP),--skip-file-re '$(NBTEST_SKIP)') $(NBTEST_ARGS)

# Two passes: every test but those marked `serial`, on PYTEST_WORKERS processes; then the `serial` ones, one at a time.
# Exit code 5 (nothing selected) is an error only when neither pass ran a test. `PYTEST_MARK='not slow'` (`make test-fast`) has no
# second pass: tests/conftest.py marks every serial test slow (collecting the suite again to select none took 9 s).
pytest: venv ## run the pytest suite in tests/ on both cores, then the 2-process tests (PYTEST_ARGS: more options, e.g. '-x'; PYTEST_MARK: e.g. 'not slow')
	@mark='$(PYTEST_MARK)'; and=$${mark:+ and ($$mark)}; \
	xdist=$$([ "$(PYTEST_WORKERS)" -gt 1 ] && echo "-n $(PYTEST_WORKERS) --dist loadfile"); \
	echo ">>> pytest: the tests not marked serial$${xdist:+, on $(PYTEST_WORKERS) processes}"; \
	rc1=0; $(BIN)/pytest -q $$xdist -m "not serial$$and" $(PYTEST_ARGS) tests || rc1=$$?; \
	echo ">>> pytest: the tests marked serial (2 processes each), one at a time"; \
	rc2=5; if [ "$$mark" != 'not slow' ]; then rc2=0; $(BIN)/pytest -q -m "serial$$and" $(PYTEST_ARGS) tests || rc2=$$?; else echo "(none: every serial test is slow, tests/conftest.py)"; fi; \
	if [ $$rc1 = 5 ] && [ $$rc2 = 5 ]; then echo "!!! pytest collected no tests in tests/"; exit 5; fi; \
	for rc in $$rc1 $$rc2; do if [ $$rc != 0 ] && [ $$rc != 5 ]; then exit $$rc; fi; done

docs-check: venv ## the docs site: nbdev processes every notebook, pages render, no dead link, tutorials show outputs, no code cut at 1280 px (headless Chromium), the search finds a callback, no temporary path in an output
	$(PY) scripts/docs.py check

slow: setup ## run the notebooks including cells flagged #| slow
	$(BIN)/nbdev-test --n-workers $(N_WORKERS) --flags slow --timing

export: venv ## nbdev-export: regenerate aisaac/ from the notebooks
	$(BIN)/nbdev-export

readme: venv ## rewrite README.md from nbs/index.ipynb, CONTRIBUTING.md from nbs/guides/contributing.ipynb
	$(PY) scripts/readme_sync.py

clean: venv ## nbdev-clean: strip notebook metadata/outputs noise
	$(BIN)/nbdev-clean

bench: setup ## run every bench/*.py (not the helpers in bench/_*.py)
	@shopt -s nullglob; files=(bench/[!_]*.py); \
	if [ $${#files[@]} = 0 ]; then echo "no benchmarks in bench/"; exit 0; fi; \
	for f in "$${files[@]}"; do echo ">>> $$f"; $(PY) "$$f"; done

docs: setup ## run every notebook in a Jupyter kernel (slow cells too), save it with its outputs, render the site
	$(PY) scripts/run_nbs.py $(RUN_ARGS) $(NBS)
	$(PY) scripts/docs.py render

site: venv ## render the docs site into _docs/ (Quarto, or pandoc as a stand-in) without failing on problems
	$(PY) scripts/docs.py render

shots: site ## screenshots of rendered pages (PAGES=...) with headless Chromium, in out/shots/
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then apt-get install -y -qq chromium; \
	  else echo "!!! shots: install chromium (Debian package \`chromium\`) to take screenshots"; exit 1; fi; }
	$(PY) scripts/docs.py shots $(PAGES)

lab: venv ## open the notebooks in JupyterLab (installs the `notebook` extra on first use)
	@[ -x "$(BIN)/jupyter-lab" ] || { echo ">>> installing the notebook extra (JupyterLab, ipywidgets)"; \
	  "$(PY)" -m pip install -q -e ".[$(EXTRAS),notebook]"; }
	$(BIN)/jupyter lab nbs $(LAB_ARGS)
