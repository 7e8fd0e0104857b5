"""Where measured usage comes from (Prometheus), polled in the background into
immutable ``app.domain.usage.UsageSnapshot``s; and where that Prometheus is: the one the
descheduler's own policy names (``discovery``, which reads ConfigMaps and Secrets through the
Kubernetes client), and whether steering is on (``steering``). Imports only the domain and leaf
utilities."""
