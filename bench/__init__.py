"""tidemq benchmarks: run ``python -m bench.run_all [--quick] [--json]``."""
