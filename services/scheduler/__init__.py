"""The scheduler: delivers delayed messages (delay levels and arbitrary timers) on time.

It walks the broker's delay-level queues, takes arbitrary timers from the broker's intake topic
into its own time-bucketed log on disk (``timers.TimerStore``), and delivers what is due back
to the broker in large batches. Progress per level and on the intake topic lives in Redis.
"""
