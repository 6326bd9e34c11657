"""Why the head's generation engine hung on the GPU hosts: a process forked after its parent ran torch's OpenMP
pool hangs in its first parallel torch op, a spawned one does not.

    python -m benchmarks.fork_after_openmp [--timeout-s 20]

`prepare-demo --wide --eagle3` widens the target (torch.zeros of 13 GB of bfloat16 weights: parallel fills)
and then builds vLLM's LLM in the same process; on a GPU host vLLM forks its engine core unless CUDA is
already initialised. Three cases, each in a fresh interpreter: the parent builds a widened weight as
tuner/models/wide.py does (or nothing), then starts a child by fork or spawn that runs a parallel torch op.
Prints a table and writes benchmarks/results/fork-after-openmp-DATE.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import print_table, write_result

CASES = [("nothing", "fork"), ("widened weight", "fork"), ("widened weight", "spawn")]


def _child(q: Any) -> None:
    import torch

    torch.zeros(4096, 4096).add_(1)
    q.put("done")


def _case(parent: str, method: str, timeout_s: float) -> None:
    import torch

    if parent == "widened weight":
        w = torch.zeros(14336, 4096, dtype=torch.bfloat16)  # one widened MLP weight of the wide target
        w[:64, :576] = 1.0
    ctx: Any = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(timeout_s)
    hung = p.is_alive()
    p.kill()
    print("hung" if hung else q.get())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-s", type=float, default=20.0, help="how long a child may take")
    parser.add_argument("--case", nargs=2, metavar=("PARENT", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        _case(args.case[0], args.case[1], args.timeout_s)
        return
    import torch

    rows = []
    for parent, method in CASES:
        started = time.monotonic()
        cmd = [sys.executable, "-m", "benchmarks.fork_after_openmp", "--timeout-s", str(args.timeout_s)]
        out = subprocess.run([*cmd, "--case", parent, method], capture_output=True, text=True, check=True)
        outcome = out.stdout.strip().splitlines()[-1]
        rows.append(
            {
                "parent ran": parent,
                "child started by": method,
                "child": outcome,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )
    print_table(["parent ran", "child started by", "child", "wall s"], [list(r.values()) for r in rows])
    path = write_result(
        "fork-after-openmp",
        {"torch": torch.__version__, "threads": torch.get_num_threads(), "timeout_s": args.timeout_s, "rows": rows},
    )
    print(f"-> {path}")


if __name__ == "__main__":
    main()
