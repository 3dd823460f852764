from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stages.training.records import StepRecorder


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_step_record_is_one_operator_and_flushes_the_values() -> None:
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    values = {
        "loss": loss,
        "grad_norm": torch.tensor(1.5),
        **{f"s{i}": torch.tensor(i / 4) for i in range(10)},
    }
    recorder = StepRecorder("infonce")
    with CountOps() as counted:
        recorder.record(1, values, lr=0.1)
    assert counted.ops == ["aten.stack.default"]  # not detach + cast + reshape per value
    recorder.record(
        2, {"loss": torch.tensor([2.0], dtype=torch.bfloat16), "grad_norm": torch.tensor(3)}
    )
    first, second = recorder.flush()
    assert first == {"event": "train", "step": 1, "lr": 0.1, "loss": 6.0, "grad_norm": 1.5,
                     **{f"s{i}": i / 4 for i in range(10)}}  # fmt: skip
    assert second == {"event": "train", "step": 2, "loss": 2.0, "grad_norm": 3.0}
    assert not recorder._pending and recorder.flush() == []
