"""Locust load scenarios (agent tool loops, IDE completion, RAG, chat) and their measurement.

workloads.py, sse_meter.py and samples.py are plain Python (tests import them); load_hooks.py,
http_stream.py and the locustfiles import Locust, which monkey-patches the process with gevent,
so only a `locust` process imports them.
"""
