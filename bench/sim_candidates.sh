#!/bin/sh
# The candidate comparison: every default scenario x seeds (1-10) x today's plain OpenShift settings, the guard at
# its defaults (steering on), without steering, and each candidate variant (app/sim/guards.py), then the table in
# docs/simulator.md (bench/sim_candidates.py). About 880 runs of ~2 s CPU each (fleet: ~5 s).
# Usage: [SEEDS=1-3] bench/sim_candidates.sh [OUT_DIR] [DOC]
set -eu
OUT=${1:-sim-candidates}
README=${2:-docs/simulator.md}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-1-10}
CANDIDATES="guard-nocancel guard-nodecool guard-targetcool guard-settle guard-longrest guard-churn"
MODES="ocp,ocp-node1,ocp-actuation,ocp+guard,ocp+guard-nosteer"
for c in $CANDIDATES; do MODES="$MODES,ocp+$c"; done
SCENARIOS=""
for s in reference-stress pilot failing-migrations drains mixed-sizes hourly fleet tight; do
  SCENARIOS="$SCENARIOS --scenario examples/scenarios/$s.yaml"
done
CMD="simulate$SCENARIOS --seeds $SEEDS --modes $MODES --jobs 2 --out $OUT --format csv"
# shellcheck disable=SC2086
nice "$PY" -m app $CMD > "$OUT.log"
"$PY" -m bench.sim_candidates --dir "$OUT" --readme "$README" --command "kubevirt-eviction-guard $CMD" > "$OUT.md"
if [ "$README" = docs/simulator.md ]; then "$PY" -m tools.figures stamp candidates; fi
echo "wrote $OUT/, $OUT.md and the table in $README"
