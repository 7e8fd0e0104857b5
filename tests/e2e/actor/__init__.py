"""The actor: kubelet, the scheduler and KubeVirt (virt-api's eviction admitter, virt-controller's evacuation and
migration controllers) as one process against the real API server, for the end-to-end outcome run.

Its KubeVirt is the simulator's (``app.sim.kubevirt.KubeVirt``, v1.7+ semantics) driven in real time, with every
object it holds written to the API server as KubeVirt would write it (``kubevirt.py``); its eviction admitter is a
real validating webhook (``admitter.py``); the load comes from the scenario's load model and is served to Prometheus
(``load.py``). ``python -m tests.e2e.actor --help`` runs it.
"""
