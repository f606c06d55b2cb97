"""The loop every worker runs, whatever its role, and what it does for the role: requests
to the scheduler, leases and how each ends, heartbeats, the routing identity, the data
plane's payloads, versions followed or published, weights received, where the time goes,
and the checks before a run (loop.py drives an Actor). It knows no model, engine, task or
serving code: what a role needs at its start is in actors/startup."""
