#!/bin/sh
# Printed by `make run`: requests to paste into a second terminal while the guard serves the demo.
HOST=${1:-127.0.0.1}
PORT=${2:-8443}
cat <<MSG

kubevirt-eviction-guard demo: https://$HOST:$PORT, cluster state examples/demo-snapshot.yaml as of 2026-11-21T12:00:00Z
Paste into another terminal (from this directory):

  # denied (429, reason cooldown): the descheduler evicts a VM that migrated 5 minutes ago
  curl -s --cacert certs/ca.crt -H 'Content-Type: application/json' \\
    --data @examples/requests/deny-cooldown.json https://$HOST:$PORT/mutate; echo

  # allowed: the descheduler evicts a VM that never migrated, on a quiet node
  curl -s --cacert certs/ca.crt -H 'Content-Type: application/json' \\
    --data @examples/requests/allow-quiet-vm.json https://$HOST:$PORT/mutate; echo

  # more: deny-node-busy.json, deny-migrating.json, allow-admin-eviction.json in examples/requests/
  # health and metrics
  curl -s --cacert certs/ca.crt https://$HOST:$PORT/readyz; echo
  curl -s --cacert certs/ca.crt https://$HOST:$PORT/metrics | grep '^kubevirt_eviction_guard_decisions'

MSG
