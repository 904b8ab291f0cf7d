"""The faults suite: namespace hosts, nemeses, a workload recording a history, its checker."""
