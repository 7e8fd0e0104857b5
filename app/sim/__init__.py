"""A deterministic simulator of KubeVirt and the descheduler that runs the guard's real policy."""
