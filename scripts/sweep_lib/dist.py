"""Which share of the cells this process runs: rank and world size from accelerate, else one process."""

from __future__ import annotations

import datetime as dt
import os


class Dist:
    """rank / world size from accelerate (when launched with several processes), else a single process."""

    def __init__(self):
        self.state = None
        self.rank, self.world = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch
            from accelerate import PartialState

            # cpu=True without a GPU: gloo process group (else accelerate falls back to one process per rank,
            # each believing it is alone). Long timeout: ranks may finish their shares hours apart.
            cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in (
                "1",
                "true",
            )
            self.state = PartialState(cpu=cpu, timeout=dt.timedelta(days=7))
            self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def shard_rank(self) -> int | None:
        """The rank that names this process' files (records.rank{N}.jsonl, its lock); None in one process."""
        return self.rank if self.world > 1 else None

    def wait(self):
        if self.state is not None:
            self.state.wait_for_everyone()

    def device(self, wanted: str | None) -> str | None:
        if self.state is not None and wanted is None:
            d = str(self.state.device)
            return d if d.startswith(("cuda", "mps", "xpu")) else "cpu"
        return wanted
