# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8443
DEMO_NOW = 2026-11-21T12:00:00Z

.PHONY: run test setup certs clean bench-watch

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

# list+watch throughput and memory: 100k VMIs, 100k launcher pods, 500k VMIMs (a few minutes)
bench-watch: $(STAMP)
	$(PY) bench/watch_bench.py

clean:
	rm -rf $(VENV) certs .pytest_cache .hypothesis
