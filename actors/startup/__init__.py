"""What a role that holds a model does at its start, beside the roles that call it: the
model loaded on its device and engine (model_loading.py), and the checks a role declares
before a run (role_checks.py: model directory, engine, device, task, harness). The
worker's loop knows none of it: it asks a role for its checks, and the role starts its
own model."""
