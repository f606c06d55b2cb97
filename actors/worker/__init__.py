"""The loop every worker runs, whatever its role, and what it does for the role: requests
to the scheduler, leases and how each ends, heartbeats, the routing identity, the data
plane's payloads, versions followed or published, weights received, where the time goes,
the model a role starts with, and the checks before a run (loop.py drives an Actor)."""
