"""How ``optimize --workers N`` divides a machine between its local workers."""

from __future__ import annotations

from tuner.workers import cpu_slices, gpu_slices


def test_gpus_are_split_into_disjoint_groups_then_shared() -> None:
    assert gpu_slices(2, ["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert gpu_slices(3, ["0", "1"], 1) == ["0", "1", "0"]
    assert gpu_slices(2, ["0"], 1) == ["0", "0"]  # two workers share one GPU
    assert gpu_slices(2, [], 1) == [None, None]


def test_cpu_workers_get_their_own_cores() -> None:
    assert cpu_slices(2, [0, 1]) == ["0", "1"]
    assert cpu_slices(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]
    assert cpu_slices(1, [0, 1]) == [None]  # one worker: vLLM's own binding
    assert cpu_slices(3, [0, 1]) == [None, None, None]  # fewer cores than workers: leave vLLM to it
