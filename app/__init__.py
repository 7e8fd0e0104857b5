"""kubevirt-eviction-guard: an admission webhook that keeps rebalancers from churning KubeVirt VMs."""

__version__ = "0.1.0"
