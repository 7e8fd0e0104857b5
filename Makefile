# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8443
DEMO_NOW = 2026-11-21T12:00:00Z

.PHONY: run test setup certs clean fuzz simulate constraints bench bench-doc bench-watch reliability docs

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

# The documentation site (docs/, mkdocs.yml), strict: a broken link or anchor fails. Output: build/site.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict
	@echo "built build/site/index.html"

# Optional: coverage-guided fuzzing with atheris (libFuzzer), 60 s per target; corpus seeded from the fixtures.
fuzz: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check 'atheris>=2.3'
	@mkdir -p build/fuzz/admission build/fuzz/snapshot
	cp tests/fixtures/admission/*.json build/fuzz/admission/
	cp examples/demo-snapshot.yaml build/fuzz/snapshot/
	$(PY) fuzz/fuzz_targets.py admission -max_total_time=60 build/fuzz/admission
	$(PY) fuzz/fuzz_targets.py snapshot -max_total_time=60 -max_len=65536 build/fuzz/snapshot

# list+watch throughput and memory: 100k VMIs, 100k launcher pods, 500k VMIMs (a few minutes)
bench-watch: $(STAMP)
	$(PY) bench/watch_bench.py

clean:
	rm -rf $(VENV) certs .pytest_cache .hypothesis

# The simulator's comparison of upstream / profile / node-limit-1 / guard modes on the built-in scenarios,
# 5 seeds each, on 2 worker processes; writes sim-out/SCENARIO/{summary.json,*.png} and the section in docs/simulator.md.
SCENARIOS = $(addprefix examples/scenarios/,reference-stress.yaml pilot.yaml failing-migrations.yaml drains.yaml \
            mixed-sizes.yaml hourly.yaml fleet.yaml tight.yaml)
SIM_STAMP = $(VENV)/.sim-installed-stamp
SIM_SEEDS ?= 1-5

$(SIM_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,sim]'
	@touch $(SIM_STAMP)

simulate: $(SIM_STAMP)
	$(PY) -m app simulate $(addprefix --scenario ,$(SCENARIOS)) --seeds $(SIM_SEEDS) --jobs 2 --out sim-out \
	  --readme docs/simulator.md

# Pins for the container image: the working virtualenv, frozen (the Dockerfile installs with --constraint).
constraints: $(STAMP)
	@{ echo "# Pinned versions for the container image (Dockerfile: pip install --constraint constraints.txt)."; \
	  echo "# Regenerate with 'make constraints' after 'make setup' (pip freeze of the working virtualenv)."; \
	  $(PY) -m pip freeze --exclude-editable --disable-pip-version-check; } > constraints.txt

# The reliability tests (API faults, replicas, forged reviews; all part of `make test`) with their figures
# printed; also written to build/reliability/*.json.
reliability: $(STAMP)
	$(PY) -m pytest -q -s tests/test_api_faults.py tests/test_replicas.py \
	  tests/effects/test_forged_reviews.py

# Performance: the guard next to a plain FastAPI route served by plain uvicorn (bench/plain.py, bench/run.py).
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

# Write the newest three `make bench` results into docs/performance.md (between its bench markers).
bench-doc: $(STAMP)
	$(PY) -m bench.doc $$(ls -1 bench/results/bench-*.json | tail -n 3) --doc docs/performance.md
