"""Nameserver: which brokers serve which topic. Brokers heartbeat their topics; clients ask routes.

State is soft: everything lives in memory and is rebuilt from broker heartbeats after a restart.
"""
