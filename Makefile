# The two commands of the README:
#   make demo   provision ONNX Runtime, build, classify the bundled default scene with the bundled model
#   make test   provision ONNX Runtime and the tests' Python packages, run every test (fmt, clippy,
#               doc, unit, integration), then list the skipped tests with their reasons
# Everything else here is what those two need.

ORT_VERSION ?= 1.31.1
ARCH := $(shell uname -m)
ORT_DIR := target/ort/$(ARCH)
ORT_LIB := $(ORT_DIR)/libonnxruntime.so.$(ORT_VERSION)
export ORT_DYLIB_PATH ?= $(abspath $(ORT_LIB))
PYTHON ?= python3
MODEL ?= models/hybridsn_salinas_a/manifest.json
DATA ?= ../shared/data
DEMO_OUT ?= out/demo
# The Python packages the tests read hsiedge's output with and the bench baseline imports
# (.ci/requirements.txt), in a venv of their own: a distribution Python may refuse a plain
# install (PEP 668, "externally managed").
VENV := target/venv
VENV_PYTHON := $(abspath $(VENV))/bin/python
# Each skipped test records why here; `make test` prints the records and their count.
SKIP_DIR := $(abspath target/test-skips)
# Runs of the auto-batch memory-wall test per cgroup limit (about 10 s each on 2 busy cores);
# CI passes MEMWALL_RUNS=20.
MEMWALL_RUNS ?= 3
# Extra arguments for `cargo test` (e.g. `--test cli`); the default runs everything.
TEST_ARGS ?=

.PHONY: demo test ort build check lint bench install python-deps gpu-test

ort: $(ORT_LIB)

$(VENV)/.installed: .ci/requirements.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r .ci/requirements.txt
	touch $@

# Without the packages, the tests that need them skip with that reason (CI fails them instead).
python-deps:
	@$(MAKE) --no-print-directory $(VENV)/.installed || \
	  echo "make: could not provision $(VENV) from .ci/requirements.txt (see above); the tests that need those Python packages will be skipped"

# ONNX Runtime comes from its PyPI wheel (the registries are the only network these machines have).
$(ORT_LIB):
	rm -rf $(ORT_DIR)/wheel && mkdir -p $(ORT_DIR)/wheel
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d $(ORT_DIR)/wheel onnxruntime==$(ORT_VERSION)
	cd $(ORT_DIR)/wheel && $(PYTHON) -m zipfile -e onnxruntime-*.whl x
	cp $(ORT_DIR)/wheel/x/onnxruntime/capi/libonnxruntime.so.$(ORT_VERSION) $@
	rm -rf $(ORT_DIR)/wheel

build: ort
	cargo build --release

demo: build
	bash tests/demo.sh $(MODEL) $(DATA) $(DEMO_OUT)

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps

# Every test binary runs (--no-fail-fast); the skips and the time are printed after cargo's own
# report, and cargo's exit status is make's.
test: ort python-deps lint
	@rm -rf $(SKIP_DIR) && mkdir -p $(SKIP_DIR)
	@start=$$(date +%s); status=0; py=; [ -f $(VENV)/.installed ] && py=$(VENV_PYTHON); \
	HSIEDGE_TEST_PYTHON=$$py HSIEDGE_TEST_SKIP_DIR=$(SKIP_DIR) HSIEDGE_MEMWALL_RUNS=$(MEMWALL_RUNS) \
	  cargo test --no-fail-fast $(TEST_ARGS) || status=$$?; \
	n=$$(cat $(SKIP_DIR)/*.txt 2>/dev/null | wc -l); \
	echo "== make test: $$n skipped"; \
	[ $$n -eq 0 ] || sort $(SKIP_DIR)/*.txt | sed 's/^/   skipped: /'; \
	echo "== make test: cargo test took $$(( $$(date +%s) - start )) s, exit status $$status"; \
	exit $$status

bench: build python-deps
	py=python3; [ -f $(VENV)/.installed ] && py=$(VENV_PYTHON); \
	target/release/hsiedge bench classify $(DATA)/salinas_a/salinas_a.hdr --model $(MODEL) --python $$py

# `make install [PREFIX=/usr/local] [DESTDIR=...]`: the binary, the ONNX Runtime it was built with (in
# lib/hsiedge, where the binary looks for it) and the models.
PREFIX ?= /usr/local
install: build
	install -D -m 755 target/release/hsiedge $(DESTDIR)$(PREFIX)/bin/hsiedge
	install -D -m 644 $(ORT_LIB) $(DESTDIR)$(PREFIX)/lib/hsiedge/libonnxruntime.so.$(ORT_VERSION)
	for m in models/*/manifest.json; do d=$$(dirname $$m); n=$$(basename $$d); \
	  [ "$$n" = fixtures ] && continue; \
	  install -d $(DESTDIR)$(PREFIX)/share/hsiedge/models/$$n; \
	  install -m 644 $$d/*.json $$d/*.onnx $(DESTDIR)$(PREFIX)/share/hsiedge/models/$$n/; \
	done

# The GPU tests and benchmarks (not in CI: they need the lent GPU machine): builds, packs the binary,
# models, Salinas-A, the PyTorch baseline and onnxruntime-gpu's libraries, and prints the device calls
# to make back to back; gpu/device.sh runs them there (results: docs/benchmarks.md).
gpu-test:
	gpu/run stage
	gpu/run parts
