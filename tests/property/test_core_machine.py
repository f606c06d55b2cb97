"""The scheduler core against a plain model, under random interleavings (see core_machine)."""

from __future__ import annotations

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE

from .core_machine import make_machine

TestAsyncPipeline = make_machine().TestCase
TestSyncPipeline = make_machine(sync=True).TestCase
# PPO's table: a values branch and the critic's step before the train step
TestCriticPipeline = make_machine(DEFAULT_PIPELINE.with_critic()).TestCase
TestSyncCriticPipeline = make_machine(DEFAULT_PIPELINE.with_critic(), sync=True).TestCase
# PPO's table with the values made in the critic's step: no values branch
TestCriticMakesValues = make_machine(DEFAULT_PIPELINE.with_critic(values_stage=False)).TestCase
