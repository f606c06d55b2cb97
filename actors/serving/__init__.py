"""The OpenAI-compatible API the generators serve to agent harnesses, and its records.

Generator side: :mod:`.bridge` (requests between the HTTP thread and the decode loop),
:mod:`.openai_api` (the routes and their request and response shapes), :mod:`.tool_calls`
(tool calls read from the model's text), :mod:`.streaming` (server-sent events),
:mod:`.http_server` (uvicorn on a thread of the generate worker), :mod:`.serving` (what the
generate role holds). Both sides: :mod:`.call_records` (what each call of a session sampled),
:mod:`.directory` (where each generator's API is), :mod:`.merge` (a session's calls into
sequences to train). Harness side: :mod:`.sessions` (a group's sessions, run on asyncio).
"""
