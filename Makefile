# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8443
DEMO_NOW = 2026-11-21T12:00:00Z

.PHONY: run test setup certs clean bench

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

certs: certs/tls.crt

certs/tls.crt: | $(STAMP)
	@mkdir -p certs
	$(PY) -m app --log-level warning certs --service kubevirt-eviction-guard \
	  --namespace kubevirt-eviction-guard --out certs > certs/cabundle.b64

run: $(STAMP) certs/tls.crt
	@sh examples/curl-examples.sh $(HOST) $(PORT)
	$(PY) -m app --log-format text serve --host $(HOST) --port $(PORT) \
	  --tls-cert certs/tls.crt --tls-key certs/tls.key \
	  --snapshot examples/demo-snapshot.yaml --now $(DEMO_NOW)

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) certs .pytest_cache .hypothesis

# Performance: the guard next to a bare FastAPI endpoint on the same stack (bench/run.py).
# wrk (Debian) drives the saturation runs when it can be installed; else the Python generator does.
BENCH_STAMP = $(VENV)/.bench-stamp
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q wrk >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q wrk >/dev/null 2>&1; }; }; } || \
	  echo "bench: wrk not available; saturation runs will use the Python load generator"
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)
