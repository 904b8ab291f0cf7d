"""The metrics sidecar: a PySpark job over ``TIDE_SYS_TRANS_EVENTS`` and its Prometheus export.

Kept import-light: Spark's Python workers import ``tidemq_server.metrics.source`` and its helpers,
so nothing here pulls in the web stack. See README.md in this folder.
"""
