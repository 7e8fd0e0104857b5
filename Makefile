# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8443
DEMO_NOW = 2026-11-21T12:00:00Z

.PHONY: run test setup certs clean fuzz simulate constraints dashboard bench bench-doc bench-servers bench-watch reliability docs e2e e2e-bin \
	e2e-outcome e2e-outcome-table e2e-oldest figures figures-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

certs: certs/tls.crt

certs/tls.crt: | $(STAMP)
	@mkdir -p certs
	$(PY) -m app certs --force --service kubevirt-eviction-guard \
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

# Optional: coverage-guided fuzzing with atheris (libFuzzer), 60 s per target; corpora seeded from the fixtures
# and fuzz/http-seeds (requests pipelined, chunked, split).
fuzz: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check 'atheris>=2.3'
	@mkdir -p build/fuzz/admission build/fuzz/snapshot build/fuzz/http
	cp tests/fixtures/admission/*.json build/fuzz/admission/
	cp examples/demo-snapshot.yaml build/fuzz/snapshot/
	cp fuzz/http-seeds/* build/fuzz/http/
	$(PY) fuzz/fuzz_targets.py admission -max_total_time=60 build/fuzz/admission
	$(PY) fuzz/fuzz_targets.py snapshot -max_total_time=60 -max_len=65536 build/fuzz/snapshot
	$(PY) fuzz/fuzz_targets.py http -max_total_time=60 -max_len=8192 build/fuzz/http

# list+watch throughput and memory: 100k VMIs, 100k launcher pods, 500k VMIMs (a few minutes); writes the
# numbers into docs/performance.md (between its watch markers)
bench-watch: $(STAMP)
	$(PY) bench/watch_bench.py
	$(PY) -m bench.doc --watch bench/results/watch.json --doc docs/performance.md
	$(PY) -m tools.figures stamp watch

clean:
	rm -rf $(VENV) certs .pytest_cache .hypothesis

# The simulator's comparison of today's OpenShift settings (ocp, ocp-node1, ocp-actuation, on KubeVirt 1.8.3 and 1.9)
# with the guard at its defaults on the built-in scenarios, 5 seeds each, on 2 worker processes; writes sim-out/SCENARIO/{summary.json,*.png} and the section in docs/simulator.md.
SCENARIOS = $(addprefix examples/scenarios/,reference-stress.yaml pilot.yaml failing-migrations.yaml drains.yaml \
            mixed-sizes.yaml hourly.yaml fleet.yaml tight.yaml)
SIM_STAMP = $(VENV)/.sim-installed-stamp
SIM_SEEDS ?= 1-5

$(SIM_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,sim]'
	@touch $(SIM_STAMP)

simulate: $(SIM_STAMP)
	$(PY) -m app simulate $(addprefix --scenario ,$(SCENARIOS)) --seeds $(SIM_SEEDS) --jobs 2 --out sim-out --force \
	  --readme docs/simulator.md
	$(PY) -m tools.figures stamp simulate

# Pins with hashes for the container image (the Dockerfile installs with --require-hashes): the runtime
# dependencies in constraints.txt, the build backend in build-constraints.txt, both at the versions of the working
# virtualenv (what `make test` tested), resolved and hashed by pip-tools from PyPI.
PIPTOOLS = $(PY) -m piptools compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	--no-emit-find-links --constraint build/venv-freeze.txt
constraints: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check 'pip-tools>=7.4,<8'
	@mkdir -p build
	$(PY) -m pip freeze --exclude-editable --disable-pip-version-check > build/venv-freeze.txt
	$(PIPTOOLS) --output-file constraints.txt pyproject.toml
	$(PIPTOOLS) --only-build-deps --all-build-deps --output-file build-constraints.txt pyproject.toml

# The reliability tests (API faults, replicas, forged reviews, hostile clients; all part of `make test`) with their
# figures printed; also written to build/reliability/*.json and into docs/reliability.md (between its markers).
# Then the hostile-client attacks (bench/attacks.py) against this tree and against RELIABILITY_BEFORE (the last
# commit served by a subclass of uvicorn's protocol, checked out in a temporary worktree), also written into
# docs/reliability.md.
RELIABILITY_BEFORE ?= 701afb9fa1493d76a6ff20a8eccc529620338f77
reliability: $(STAMP)
	$(PY) -m pytest -q -s tests/test_api_faults.py tests/test_replicas.py \
	  tests/effects/test_forged_reviews.py tests/test_hostile_clients.py
	$(PY) -m bench.doc --reliability build/reliability --doc docs/reliability.md
	$(PY) -m bench.attacks --before $(RELIABILITY_BEFORE) --out build/reliability/attacks.json --doc docs/reliability.md
	$(PY) -m tools.figures stamp faults replicas attacks

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

# The serving stacks side by side (the guard's own protocol, uvicorn, granian, hypercorn): the same app, the same
# load and attacks (bench/servers.py); the table goes into docs/performance.md and docs/reliability.md.
bench-servers: $(BENCH_STAMP)
	$(PY) -m bench.servers --doc docs/performance.md --doc docs/reliability.md

# Write the newest three `make bench` results into docs/performance.md (between its bench markers).
bench-doc: $(STAMP)
	$(PY) -m bench.doc $$(ls -1 bench/results/bench-*.json | tail -n 3) --doc docs/performance.md
	$(PY) -m tools.figures stamp bench

# The image as an OCI archive, build/image/kubevirt-eviction-guard.oci.tar, from Debian packages (mmdebstrap, umoci;
# root) by the recipe the Dockerfile follows (image/); rebuilt only when image/, app/ or the pins change.
.PHONY: image
image:
	bash image/build.sh

# End-to-end, against the real kube-apiserver, etcd, descheduler and Helm, built once from the pins in e2e/go.mod
# into build/e2e/bin (needs Go 1.26+ and the Go module proxy; cold, times and disk in docs/testing.md), then
# cached: a warm run takes about 8 minutes on 2 cores.
# Writes build/e2e/summary.json. Not part of `make test`.
# The groups (tests/e2e/conftest.py: the real node, real KubeVirt, the shared control plane, each file that starts
# its own) run side by side in E2E_JOBS pytest processes (tests/e2e/groups.py); the output ends with each group's wall
# time. E2E_ARGS go to every process (one group alone: E2E_ARGS=--e2e-group=node).
E2E_ARGS ?=
E2E_JOBS ?= 4
e2e-bin:
	bash e2e/build.sh
	bash e2e/kubevirt/build.sh

# The image (make image) is built beside the Go builds (mostly downloads and unpacking while they compile); the node's
# tests run image/build.sh again, which reports a failed build or finds the archive up to date.
e2e: $(STAMP)
	@mkdir -p build/image
	@bash image/build.sh > build/image/build.log 2>&1 & image=$$!; \
	  bash e2e/build.sh && bash e2e/kubevirt/build.sh; rc=$$?; wait $$image; \
	  tail -n 1 build/image/build.log; exit $$rc
	$(PY) -m tests.e2e.groups --jobs $(E2E_JOBS) $(E2E_ARGS)

# The control-plane checks (the guard beside kube-apiserver and etcd, the chart by Helm 3 and 4) against the oldest
# Kubernetes minor the README promises: its kube-apiserver, kubectl and etcd pinned in e2e/oldest/go.mod, built once
# into build/e2e/oldest/bin (cold: see docs/testing.md), Helm and the descheduler from `make e2e`'s pins. Writes
# build/e2e/oldest/summary.json.
E2E_OLDEST_SKIP = tests/e2e/test_outcome.py tests/e2e/test_eviction_request_api.py tests/e2e/test_node.py \
  tests/e2e/test_real_kubevirt.py tests/e2e/test_real_kubevirt_operator_view.py tests/e2e/test_real_evictions.py \
  tests/e2e/test_real_side_effects.py
e2e-oldest: $(STAMP) e2e-bin
	bash e2e/build-oldest.sh
	E2E_BIN=build/e2e/oldest/bin E2E_SUMMARY=build/e2e/oldest/summary.json \
	  E2E_KUBERNETES=$$(awk '$$1 == "k8s.io/kubernetes" {print $$2}' e2e/oldest/go.mod) \
	  $(PY) -m pytest -m e2e tests/e2e $(addprefix --ignore=,$(E2E_OLDEST_SKIP)) $(E2E_ARGS)

# The outcome run (about 18 minutes per seed): the real descheduler alone, with the guard steering (reading the run's
# Prometheus), with the guard without Prometheus, and with evictionLimits.node 1, 12 minutes of real time each (side
# by side, each on its own control plane with real virt-api and virt-controller), the actor as scheduler, kubelet and
# virt-handler with the scenario's physics, Prometheus and the load model (tests/e2e/outcome), and the simulator on
# the same scenario; SEEDS (e.g. 1-3, or 2): each seed another roll of the scenario's dice, one after the other.
# Writes build/e2e/outcome-seed<N>.json per seed, build/e2e/outcome.json and the side-by-side table in
# docs/simulator.md (the real rolls' mean and range beside the model's). Seeds run apart (SEEDS=1, then SEEDS=2, ...)
# are put together with `make e2e-outcome-table SEEDS=1-3`. Needs unshare (the descheduler runs in its own mount
# namespace) and Debian's prometheus. `make e2e` runs a 90 s form of it.
# DESCHEDULER=path POLICY=file [MODEL=mode] [STRUCTURE_ONLY=1]: also run that descheduler build with that policy as
# the extra mode "custom" (beside the built-in ones; compared with the simulator's MODEL, default upstream; the
# policy is refused unless the pinned descheduler's types read every key of it; STRUCTURE_ONLY=1 when it names
# plugins only that build has). Its table then goes to build/e2e/outcome.json only, not into the docs.
SEEDS ?= 1-3
DESCHEDULER ?=
POLICY ?=
MODEL ?= upstream
OUTCOME_EXTRA = --seeds $(SEEDS) $(if $(DESCHEDULER),--descheduler $(DESCHEDULER) --policy $(POLICY) --model $(MODEL) \
                $(if $(STRUCTURE_ONLY),--structure-only),--docs docs/simulator.md)
e2e-outcome: $(STAMP) e2e-bin
	$(PY) -m tests.e2e.outcome $(OUTCOME_EXTRA)
	$(if $(DESCHEDULER),,$(PY) -m tools.figures stamp e2e-outcome)

e2e-outcome-table: $(STAMP)
	$(PY) -m tests.e2e.outcome --seeds $(SEEDS) --table-only --docs docs/simulator.md
	$(PY) -m tools.figures stamp e2e-outcome

# Every generated figure in the docs, regenerated on this machine (hours: the simulator's candidate comparison alone
# takes about 15 minutes, the outcome run 16); each step stamps its section with the commit, the date, the machine
# and the hash of its inputs (tools/figures.py). `make figures-check` says which sections' inputs changed since.
figures: $(BENCH_STAMP) $(SIM_STAMP)
	for i in 1 2 3; do $(MAKE) bench || exit 1; done
	$(MAKE) bench-doc bench-watch reliability simulate e2e-outcome
	PY=$(PY) sh bench/sim_candidates.sh build/sim-candidates docs/simulator.md

# Which generated sections measure code that changed after they were generated (and which files); exit 1 only when
# a section or its stamp is missing.
figures-check: $(STAMP)
	$(PY) -m tools.figures check

# The chart's Grafana dashboard (charts/kubevirt-eviction-guard/dashboards/), built with Grafana's foundation SDK.
dashboard: $(STAMP)
	$(PY) -m tools.dashboard
