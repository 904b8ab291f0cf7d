"""tidemq services: nameserver, broker, checker, scheduler, metrics sidecar, and the CLI."""
