"""Running model-written code where it can harm nothing: each program in namespaces of its
own, with no network, a directory of its own and limits, killed as a whole at any of them
(:mod:`.python`)."""

from .python import CodeLimits, CodeRun, SandboxUnavailable, run_python, sandbox_problem

__all__ = ["CodeLimits", "CodeRun", "SandboxUnavailable", "run_python", "sandbox_problem"]
