"""torch.optim's calls without the compiler (axoexp.executors.optimizer_calls): torch's numbers exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from axoexp.executors import optimizer_calls

OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2}),
    "sgd_nesterov": (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    "sgd_for_loop": (torch.optim.SGD, {"lr": 1e-2, "foreach": False}),
}


def adapted(name: str, through_axoexp: bool) -> list[list[float]]:
    """Two parameters after three updates of optimizer ``name``, with its state, through
    :mod:`optimizer_calls` or torch's own calls."""
    cls, settings = OPTIMIZERS[name]
    parameters = [torch.nn.Parameter(torch.randn(5, 3, generator=torch.Generator().manual_seed(i))) for i in range(2)]
    if through_axoexp:
        with optimizer_calls.constructing():
            optimizer = cls(parameters, **settings)
    else:
        optimizer = cls(parameters, **settings)
    for update in range(3):
        for parameter in parameters:
            parameter.grad = torch.sin(parameter.detach() * (update + 1))
        if through_axoexp:
            optimizer_calls.step(optimizer)
            optimizer_calls.zero_grad(optimizer)
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    state = [value for p in parameters for value in optimizer.state[p].values() if isinstance(value, torch.Tensor)]
    return [tensor.detach().flatten().tolist() for tensor in [*parameters, *(p.grad for p in parameters), *state]]


@pytest.mark.slow  # starts an interpreter
def test_updates_without_the_compiler_are_torchs_exactly_and_leave_it_unimported() -> None:
    code = (
        "import json, sys; from test_optimizer_calls import OPTIMIZERS, adapted; "
        "print(json.dumps([{name: adapted(name, True) for name in OPTIMIZERS}, 'torch._dynamo' in sys.modules]))"
    )
    output = subprocess.check_output([sys.executable, "-c", code], text=True, cwd=__file__.rpartition("/")[0])
    ours, compiler_imported = json.loads(output)
    assert not compiler_imported
    assert ours == {name: adapted(name, False) for name in OPTIMIZERS}  # every float equal


def test_a_step_hook_gets_torchs_own_step() -> None:
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([parameter], lr=0.5)
    calls = []
    optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    parameter.grad = torch.ones(3)
    optimizer_calls.step(optimizer)
    assert calls == ["post"]
    assert parameter.tolist() == [0.5, 0.5, 0.5]
