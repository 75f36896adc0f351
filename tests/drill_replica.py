"""The drills' replica processes: ``fairshare serve`` with the test-only wall-clock hook,
and the wait until one answers.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpc import aio

from fairshare.wire.channels import open_channel
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.clock import WALL_OFFSET_ENV
from harness import serve
from harness.serve import Allocator


class Replica(Allocator):
    """One ``fairshare serve`` process of the drill cluster, with the test-only wall-clock
    hook (``step_wall_clock``) and a count of its starts."""

    def __init__(self, *, node: str, workdir: Path, etcd: str, prefix: str, config: Path) -> None:
        self.wall_offset_file = workdir / f"wall-offset-{node}"
        super().__init__(
            workdir,
            config,
            node=node,
            etcd=etcd,
            prefix=prefix,
            env={**os.environ, WALL_OFFSET_ENV: str(self.wall_offset_file)},
        )
        self.starts = 0

    def step_wall_clock(self, offset_s: float) -> None:
        """Shifts the replica's wall clock by ``offset_s`` from the real one (the hook
        re-reads the file within a fraction of a second); the machine's clock is untouched."""
        tmp = self.wall_offset_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s!r}\n", encoding="ascii")
        tmp.replace(self.wall_offset_file)

    def start(self, *, empty_state: bool = False) -> None:
        if empty_state and self.state_dir.exists():
            for child in self.state_dir.iterdir():
                child.unlink()
        self.starts += 1
        super().start()


async def _lists_pools(channel: aio.Channel) -> bool:
    await pb_grpc.AllocatorStub(channel).ListPools(pb.ListPoolsRequest(), timeout=0.5)
    return True


async def wait_serving(
    address: str, timeout_s: float = 15.0, *, exits: Replica | None = None
) -> None:
    """Waits until the replica answers ListPools.

    Raises:
        ServerExited: ``exits`` (the replica's process) ended before it answered.
        TimeoutError: no answer within ``timeout_s``.
    """
    await serve.wait_serving(
        address,
        timeout_s=timeout_s,
        process=exits,
        probe=_lists_pools,
        connect=open_channel,
        interval_s=0.1,
    )
