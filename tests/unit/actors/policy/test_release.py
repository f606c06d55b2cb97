"""Superseded weights are freed off the decode loop, and only memory nobody else holds is
emptied before it goes."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_state, state_for_saving
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.worker.release import Releaser
from tests.support.models import TINY

MiB = 1 << 20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_a_sole_holders_pages_are_given_back_before_it_is_dropped() -> None:
    tensor = torch.ones(64 * MiB // 4)  # 64 MiB, touched
    before = _resident_bytes()
    Releaser()._empty(tensor)  # ``tensor`` is the only holder of its storage
    assert before - _resident_bytes() > 60 * MiB
    # Emptied pages read as zeros: proof the pages went, not just that RSS moved.
    assert int(tensor.count_nonzero()) < MiB // 4


def test_a_storage_another_tensor_holds_keeps_its_bytes() -> None:
    tensor = torch.ones(16 * MiB // 4)
    other = tensor[1:]  # a view: the same storage, held elsewhere
    Releaser()._empty(tensor)
    assert bool((other == 1).all())


def test_memory_torch_only_wraps_is_never_emptied() -> None:
    owner = np.ones(16 * MiB // 4, np.float32)  # like a weight receiver's buffer
    tensor = torch.from_numpy(owner)
    Releaser()._empty(tensor)
    del tensor
    assert bool((owner == 1).all())


def test_release_hands_the_work_to_the_background_thread() -> None:
    releaser = Releaser()
    tensors = [torch.ones(8 * MiB // 4) for _ in range(4)]
    before = _resident_bytes()
    releaser.release(tensors)
    tensors.clear()  # the caller's references go; the releaser's are the last
    deadline = time.monotonic() + 10
    while before - _resident_bytes() < 24 * MiB and time.monotonic() < deadline:
        time.sleep(0.01)
    assert before - _resident_bytes() >= 24 * MiB  # of 32: other allocations may come and go


def test_a_switch_without_copy_returns_the_tensors_the_model_ran_on() -> None:
    torch.manual_seed(1)
    model = CausalLM(ModelConfig.from_hf(TINY))
    old = {name: t.clone() for name, t in state_for_saving(model).items()}
    new = {name: t + 1 for name, t in old.items()}
    superseded = load_state(model, new, copy=False)
    assert [t.shape for t in superseded] == [t.shape for t in old.values()]
    assert all(torch.equal(a, b) for a, b in zip(old.values(), superseded, strict=True))
    running = dict(model.named_parameters())
    assert all(running[name].data_ptr() == t.data_ptr() for name, t in new.items())


def test_a_tensor_that_cannot_be_emptied_does_not_stop_the_releases_after_it() -> None:
    releaser = Releaser()
    sparse = torch.eye(4).to_sparse()  # has no plain storage: emptying it raises
    releaser.release([sparse])
    del sparse
    tensors = [torch.ones(64 * MiB // 4)]
    before = _resident_bytes()
    releaser.release(tensors)
    tensors.clear()
    deadline = time.monotonic() + 10
    while before - _resident_bytes() < 48 * MiB and time.monotonic() < deadline:
        time.sleep(0.01)
    assert before - _resident_bytes() >= 48 * MiB  # room for what logging the first allocates


def test_weights_in_another_precision_are_copied_in_cast_and_supersede_nothing() -> None:
    """A generator in bfloat16 (``model.generate_dtype``) takes a float32 publisher's
    weights: they cannot become its parameters, so they are cast into them."""
    torch.manual_seed(1)
    model = CausalLM(ModelConfig.from_hf(TINY)).to(torch.bfloat16)
    new = {name: t.float() + 1 for name, t in state_for_saving(model).items()}
    assert load_state(model, new, copy=False) == []
    running = dict(model.named_parameters())
    for name, tensor in new.items():
        assert running[name].dtype == torch.bfloat16
        assert torch.equal(running[name], tensor.to(torch.bfloat16)), name


def test_a_weight_of_another_shape_is_refused_even_when_copied() -> None:
    model = CausalLM(ModelConfig.from_hf(TINY))
    state = {name: t.clone() for name, t in state_for_saving(model).items()}
    name = next(iter(state))
    state[name] = state[name][:1]  # a copy would broadcast it over every row
    with pytest.raises(ValueError, match=rf"weight '{re.escape(name)}' is \(1,"):
        load_state(model, state, copy=True)
