# Two entry points (see README): `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean horovod mxnet pslite nccl

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the local CPU wheel; `torch>=2.1` in the extras then resolves to it
	# instead of pulling a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[torch,test]'
	# TensorFlow (tensorflow-cpu==2.21.0) shares the core venv: its numpy range admits torch's
	# (checked with pip install --dry-run); pip's cache keeps re-installs fast
	$(BIN)/pip install --quiet -e '.[tensorflow]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py --out demo-out

# Horovod 0.28.1 built from its sdist with patches/horovod (gloo, CPU); the wheel is cached in
# ~/.cache/dpro-kit/wheels, so only the first run on a machine compiles (~3 min on 2 cores).
# DPRO_HOROVOD_BUILD=0: never compile (the Horovod tests then skip and say why).
horovod: $(STAMP)
	bash patches/horovod/build.sh $(BIN)/python

# ps-lite (BytePS's fork, from the byteps==0.2.5.post15 sdist) with patches/ps-lite, against Debian's
# libzmq3-dev; its test programs are cached in ~/.cache/dpro-kit/ps-lite/<hash>/ (~20 s once, then instant).
# DPRO_PSLITE_BUILD=0: never compile (the real ps-lite test then skips and says why).
pslite: $(STAMP)
	@bash patches/ps-lite/build.sh $(BIN)/python >/dev/null || [ $$? = 3 ]

# MXNet 1.9.1 in its own venv (it needs numpy<1.24; dpro's core does not share it): cached in
# ~/.cache/dpro-kit/mxnet-venv, rebuilt only when the requirement set below changes (pip's cache
# keeps a rebuild fast). collectors/mxnet (standard library only) is loaded into it by `dpro profile`.
MXNET_REQ := mxnet==1.9.1 numpy<1.24
MXNET_VENV := $(HOME)/.cache/dpro-kit/mxnet-venv
mxnet:
	@[ "$$(cat $(MXNET_VENV)/.req 2>/dev/null)" = "$(MXNET_REQ)" ] || { rm -rf $(MXNET_VENV) && \
	  $(PY) -m venv $(MXNET_VENV) && $(MXNET_VENV)/bin/pip install --quiet $(foreach r,$(MXNET_REQ),'$(r)') && \
	  $(MXNET_VENV)/bin/python -c 'import mxnet' && echo '$(MXNET_REQ)' > $(MXNET_VENV)/.req; } || \
	  echo "note: MXNet venv not built; the MXNet job tests will be skipped"

# NCCL profiler plugin + the harness that drives it without a GPU (collectors/nccl, docs/nccl.md);
# needs only a C compiler (the tests build their own copy and skip, saying why, without one).
nccl:
	@if command -v $(CC) >/dev/null 2>&1; then $(MAKE) -s -C collectors/nccl CC=$(CC); \
	  else echo "note: no C compiler; the NCCL plugin is not built and its tests will be skipped"; fi

test: $(STAMP) horovod mxnet pslite nccl
	@# the report's browser tests need Chromium: installed when root (as in CI), else skipped with a note
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "note: chromium missing; browser tests will be skipped"
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/replay_speed.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache
