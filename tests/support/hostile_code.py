"""Programs a model could write to harm the machine its reward runs them on, as responses
to the code task (:mod:`asyncrl.actors.tasks.code`), and a reward plug-in that answers
with them in place of the model's response now and then.

Each is a response: after ``return`` goes ``None`` (never a right result, so nothing of
it scores by chance), and the rest of the text is statements at the program's top
level, which run before the tests do. ``kill the parent`` waits after its kill: where the
kill did nothing (as in the sandbox), it then runs out of time.
"""

from __future__ import annotations

import itertools

from asyncrl.actors.tasks import Sample
from asyncrl.actors.tasks.code import CodeTask

__all__ = ["ESCAPED", "EVERY", "HOSTILE", "reward"]

ESCAPED = "/var/tmp/asyncrl-hostile-code-was-here"  # where "write outside" writes
HOSTILE = {
    "infinite loop": "None\nwhile True:\n    pass",
    "fork bomb": "None\nimport os\nwhile True:\n    os.fork()",
    "memory hog": "None\nhog = []\nwhile True:\n    hog.append(bytearray(1 << 20))",
    "network": "None\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)",
    "write outside": f"None\nopen({ESCAPED!r}, 'w').write('x')",
    "huge output": "None\nwhile True:\n    print('x' * 4096)",
    "kill the parent": "None\nimport os, time\nos.kill(os.getppid(), 9)\ntime.sleep(60)",
}
EVERY = 3  # the plug-in's calls between two hostile programs

_TASK = CodeTask(timeout_s=1.0)
_calls = itertools.count()
_hostile = iter(HOSTILE.values())


def reward(sample: Sample, response: str) -> float:
    """The code task's reward, but every ``EVERY``-th call (in this process) of the
    first ``EVERY * len(HOSTILE)`` scores the next hostile program instead, each once."""
    if next(_calls) % EVERY == 0:
        response = next(_hostile, response)
    return _TASK.reward(sample, response)
