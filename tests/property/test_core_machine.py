"""The scheduler core against a plain model, under random interleavings (see core_machine)."""

from __future__ import annotations

from .core_machine import make_machine

TestAsyncPipeline = make_machine().TestCase
TestSyncPipeline = make_machine(sync=True).TestCase
