"""Delayed messages: routing to delay levels and timers, and the internal API the scheduler uses."""
