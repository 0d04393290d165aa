"""The only I/O of kvpool: Kubernetes API, Prometheus, engine metrics, Redis, files, clock."""
