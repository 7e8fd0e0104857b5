"""The check of the real descheduler's cycles against the simulator's rules (tests/e2e/outcome/cycles.py), on log
lines as descheduler v0.36 writes them at --v 3 (from an end-to-end run: evictionLimits.node 1,
maxNoOfPodsToEvictPerNode 2, VMs whose evacuations never end)."""

from __future__ import annotations

import dataclasses

from app.sim.scenario import DeschedulerSettings
from tests.e2e.outcome.cycles import check, parse

LOG = """\
I1124 12:18:03.374745   30676 descheduler.go:235] Resetting pod evictor counters
I1124 12:18:03.376338   30676 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"56"}
I1124 12:18:03.376354   30676 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=3 nonRemovablePods=0 removablePods=3
I1124 12:18:03.454963   30676 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-db-08-00001"
I1124 12:18:03.455012   30676 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=1
I1124 12:18:04.461021   30676 evictions.go:360] "Eviction in background detected. Updating the cache." pod="vms/virt-launcher-db-08-00001"
I1124 12:18:13.375628   30676 descheduler.go:235] Resetting pod evictor counters
I1124 12:18:13.377024   30676 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"56"}
I1124 12:18:13.377039   30676 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=3 nonRemovablePods=0 removablePods=3
I1124 12:18:13.416889   30676 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-db-07-00001"
I1124 12:18:13.416940   30676 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=1
I1124 12:18:23.376005   30676 descheduler.go:235] Resetting pod evictor counters
I1124 12:18:23.378983   30676 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"66"}
I1124 12:18:23.379000   30676 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=3 nonRemovablePods=0 removablePods=3
I1124 12:18:23.379022   30676 evictions.go:499] "Eviction in background already requested (ignoring)" pod="vms/virt-launcher-db-08-00001"
I1124 12:18:23.379030   30676 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=1
I1124 12:18:33.376876   30676 descheduler.go:235] Resetting pod evictor counters
I1124 12:18:33.378135   30676 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"65"}
I1124 12:18:33.378151   30676 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=3 nonRemovablePods=0 removablePods=3
E1124 12:18:33.378229   30676 evictions.go:534] "Error evicting pod" err="maximum number of evicted pods per node reached" limit=2 node="worker-00"
I1124 12:18:34.100000   30676 evictions.go:403] "Pod with eviction in background deleted/evicted. Removing pod from the cache." pod="vms/virt-launcher-db-07-00001"
I1124 12:18:43.377143   30676 descheduler.go:235] Resetting pod evictor counters
I1124 12:18:43.378383   30676 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"57"}
I1124 12:18:43.378398   30676 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=3 nonRemovablePods=0 removablePods=3
E1124 12:18:43.380000   30676 evictions.go:560] "Error evicting pod" err="error when evicting pod (ignoring) \\"virt-launcher-db-06-00001\\": admission webhook \\"guard\\" denied the request: node busy"
E1124 12:18:43.380010   30676 nodeutilization.go:328] "eviction failed" err="error when evicting pod (ignoring) \\"virt-launcher-db-06-00001\\": admission webhook \\"guard\\" denied the request: node busy"
I1124 12:18:43.378424   30676 evictions.go:499] "Eviction in background already requested (ignoring)" pod="vms/virt-launcher-db-08-00001"
I1124 12:18:43.378432   30676 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=1
"""
LIMITS = DeschedulerSettings(eviction_limit_node=1, max_per_node=2, max_total=5)


def test_reads_each_visit_with_the_in_flight_entries_of_its_cycle():
    cycles = parse(LOG)
    assert [c.in_flight_total for c in cycles] == [0, 1, 2, 2, 1]
    visits = [(b.started, b.cached, b.refused, b.in_flight, b.stop) for c in cycles for b in c.blocks]
    assert visits == [(1, 0, 0, 0, "plugin_limit"), (1, 0, 0, 1, "plugin_limit"), (0, 1, 0, 2, "plugin_limit"),
                      (0, 0, 0, 2, "node_limit"), (0, 1, 1, 1, "plugin_limit")]


def test_the_log_agrees_with_the_models_limits_and_a_wrong_limit_is_caught():
    checked = check(parse(LOG), LIMITS)
    assert checked["inconsistent_count"] == 0
    # the visits with a VM in flight: one sent a second VM, two met the in-flight pod first, one found 2 in flight
    assert checked["with_in_flight"] == {"visits": 4, "sent_another": 1, "in_flight_pod_first": 2, "node_full": 1}
    # a per-node limit of 1 with the in-flight entry counted: the second cycle's eviction breaks it
    wrong = check(parse(LOG), dataclasses.replace(LIMITS, max_per_node=1))
    assert wrong["inconsistent_count"] >= 1
    assert wrong["inconsistent"][0]["cycle"] == 1
    assert "over maxNoOfPodsToEvictPerNode with the in-flight entries" in wrong["inconsistent"][0]["problems"]
    # a node that stopped at the pod evictor's limit below it: the model would have sent another
    assert check(parse(LOG), dataclasses.replace(LIMITS, max_per_node=3))["inconsistent_count"] == 1


# From an outcome run (descheduler v0.36, evictionLimits.node 2, maxNoOfPodsToEvictPerNode 2): app-08's migration
# ended in the second the cycle began; the informer removed its pod from the cache 11 ms into the cycle, before the
# pod evictor read the cache for the first eviction.
MID_CYCLE = """\
I1126 13:49:32.119004   12189 descheduler.go:235] Resetting pod evictor counters
I1126 13:49:32.120975   12189 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"21"}
I1126 13:49:32.120979   12189 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=12 nonRemovablePods=0 removablePods=12
I1126 13:49:32.153081   12189 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-app-08-xkp2t"
I1126 13:49:32.208357   12189 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-app-31-5bfkc"
I1126 13:49:32.208408   12189 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=2
I1126 13:49:41.545376   12189 evictions.go:333] "Pod with eviction in background completed. Removing pod from the cache." pod="vms/virt-launcher-app-31-5bfkc"
I1126 13:49:42.119116   12189 descheduler.go:235] Resetting pod evictor counters
I1126 13:49:42.120640   12189 nodeutilization.go:193] "Evicting pods from node" node="worker-00" usage={"MetricResource":"22"}
I1126 13:49:42.120643   12189 nodeutilization.go:200] "Pods on node" node="worker-00" allPods=11 nonRemovablePods=0 removablePods=11
{removal}I1126 13:49:42.140000   12189 evictions.go:357] "Eviction in background detected. Updating the cache." pod="vms/virt-launcher-app-28-jmrbq"
I1126 13:49:42.154247   12189 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-app-28-jmrbq"
I1126 13:49:42.206827   12189 evictions.go:641] "Eviction in background assumed" pod="vms/virt-launcher-app-11-w4t4m"
I1126 13:49:42.206878   12189 nodeutilization.go:278] "Max number of evictions per node per plugin reached" limit=2
{late}"""
REMOVAL = ('I1126 13:49:42.130332   12189 evictions.go:333] "Pod with eviction in background completed. Removing pod '
           'from the cache." pod="vms/virt-launcher-app-08-xkp2t"\n')


def test_the_cache_is_read_at_each_eviction_not_at_the_cycles_start():
    limits = DeschedulerSettings(eviction_limit_node=2, max_per_node=2, max_total=5)
    # the in-flight entry went 11 ms into the cycle: both evictions were within the limit when they were sent (the
    # informer's entry of the cycle's own pod, seen before its answer, is not another pod in flight)
    cycles = parse(MID_CYCLE.replace("{removal}", REMOVAL).replace("{late}", ""))
    checked = check(cycles, limits)
    assert checked["inconsistent_count"] == 0
    assert checked["changed_mid_cycle"] == 1
    assert [c.blocks[0].node_at_send for c in cycles] == [[0, 1], [0, 1]]
    # the same entry gone only after the cycle: the second eviction broke the per-node limit
    wrong = check(parse(MID_CYCLE.replace("{removal}", "").replace("{late}", REMOVAL)), limits)
    assert wrong["inconsistent_count"] == 1
    assert wrong["inconsistent"][0]["problems"] == ["over maxNoOfPodsToEvictPerNode with the in-flight entries"]
