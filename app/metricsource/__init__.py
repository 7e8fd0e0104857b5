"""Where measured usage comes from (Prometheus), polled in the background into
immutable ``app.domain.usage.UsageSnapshot``s. Imports only the domain and leaf utilities."""
