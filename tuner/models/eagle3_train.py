"""Run speculators' EAGLE-3 trainer on CPU: ``python -m tuner.models.eagle3_train -- <speculators train args>``.

Runs in the training environment (requirements/eagle3-train.txt: speculators 0.9.0), never in the pinned
vLLM one, and imports nothing else of the tuner. speculators 0.9.0 trains on an accelerator: with none it
still moves the model and batches to device index 0 (``self.model.to(self.local_rank)``) and autocasts
for "cuda". On a machine without one (this project's CPU hosts, where a head for the 135M demo target
trains in minutes) both are pointed at the CPU here, and its data loader's memory pinning is skipped; everything else is speculators' own code. On a GPU
host nothing is changed.
"""

from __future__ import annotations

import sys


def _cpu_only() -> None:
    import torch

    if torch.accelerator.current_accelerator() is not None:
        return
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    real = torch.accelerator.current_accelerator

    def current(check_available: bool = False) -> torch.device | None:
        return None if check_available else real() or torch.device("cpu")

    torch.accelerator.current_accelerator = current
    torch.accelerator.is_available = lambda: False
    torch.accelerator.synchronize = lambda device=None: None
    # Its data loader pins batches (pin_memory=True), which needs an accelerator.
    import torch.utils.data._utils.pin_memory as pinning

    pinning.pin_memory = lambda data, device=None: data


def main(argv: list[str]) -> None:
    _cpu_only()
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig

    train(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if a != "--"])
