"""What every part of one client shares: its holder, its live grants, whether it is closed,
and how its parts start background work.

``ClientState`` is made once per ``AllocatorClient`` and handed to each of its parts
(``fairshare.client.adoption``, ``fairshare.client.backlog``, ``fairshare.client.sessions``),
which read and change it in place; nothing else in it belongs to one part.

Guarantees: once ``closed`` is set, neither ``spawn`` nor ``background`` starts a task (a
coroutine handed to ``spawn`` then is closed unrun); ``background`` runs at most one task per
loop it is given. Spawned tasks stay in ``tasks`` until they end, so that closing the client
can cancel them. Not guaranteed: that a task already started stops when ``closed`` is set
(each loop checks it; the client's ``close`` cancels them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairshare.client.grants import ClientGrant


class ClientState:
    """The state the parts of one client share (see the module doc)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.live: dict[str, ClientGrant] = {}
        """The grants acquired and not yet released, by id."""
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        """One-off tasks started by ``spawn`` and not ended yet."""

    def background(
        self,
        task: asyncio.Task[None] | None,
        loop: Callable[[], Coroutine[object, object, None]],
        name: str,
    ) -> asyncio.Task[None] | None:
        """``task`` while it runs, else a new task running ``loop()`` (none once the
        client is closed): how each background loop of the client is started once."""
        if self.closed or (task is not None and not task.done()):
            return task
        return asyncio.get_running_loop().create_task(
            loop(), name=f"fairshare-client-{self.holder}-{name}"
        )

    def spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        """Runs ``coro`` as a task of its own, kept in ``tasks`` until it ends."""
        if self.closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro, name=f"fairshare-client {name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
