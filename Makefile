# The two commands of the README:
#   make demo   provision ONNX Runtime, build, classify the bundled default scene with the bundled model
#   make test   provision ONNX Runtime, run every test (fmt, clippy, doc, unit, integration)
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

.PHONY: demo test ort build check lint bench install

ort: $(ORT_LIB)

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

test: ort lint
	cargo test

bench: build
	target/release/hsiedge bench classify $(DATA)/salinas_a/salinas_a.hdr --model $(MODEL)

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
