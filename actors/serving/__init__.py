"""The OpenAI-compatible API the generators serve to agent harnesses, and its records.

Generator side: :mod:`.bridge` (requests between the HTTP thread and the decode loop),
:mod:`.openai_api` (the routes, and what becomes of a call), :mod:`.api_requests` (request
bodies checked into the calls the decoder serves), :mod:`.api_replies` (the replies'
shapes: choices, usage, log-probs, tool calls), :mod:`.api_streams` (a streamed call's
chunks), :mod:`.api_errors` (refusals in OpenAI's error shape), :mod:`.chat_turns` (a chat
session's exact tokens across turns), :mod:`.tool_calls` (tool calls read from the
model's text), :mod:`.streaming` (server-sent events), :mod:`.http_server` (uvicorn on a
thread of the generate worker), :mod:`.serving` (what the generate role holds). Both
sides: :mod:`.call_records` (what each call of a session sampled), :mod:`.directory`
(where each generator's API is), :mod:`.merge` (a session's calls into sequences to
train). Harness side: :mod:`.sessions` (a group's sessions, run on asyncio). Reward side:
:mod:`.judge` (a generative judge, through a greedy session).
"""
