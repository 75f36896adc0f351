"""How fairshare's own processes make gRPC poll (``fairshare.wire.polling``): the switch is
set before ``grpc`` is imported, an operator's own is kept, and the gRPC of the lock knows
the switches it names (a name it does not know is logged on stderr at the first channel).

Each check runs a fresh interpreter: gRPC reads the switch once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fairshare.wire import polling

pytestmark = pytest.mark.timeout(60)

# Imports the package under test first, then opens a client channel and a server, as a
# replica and a gateway do; prints the switch as the process ended up with it.
PROBE = """
import {first}
import asyncio, os
import grpc
from grpc import aio

async def main():
    server = aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel("127.0.0.1:1")
    await channel.close()
    await server.stop(None)

asyncio.run(main())
print(repr(os.environ.get("GRPC_EXPERIMENTS")))
"""


def probe(first: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != polling.EXPERIMENTS_VARIABLE}
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


@pytest.mark.parametrize("first", ["fairshare.cli", "fairshare.integrations"])
def test_the_command_and_the_callback_choose_the_polling_thread(first: str) -> None:
    done = probe(first)
    assert done.stdout.strip() == repr(polling.POLLING_THREAD)
    assert "Unknown experiment" not in done.stderr, done.stderr


def test_an_operators_own_switch_is_kept_even_empty() -> None:
    assert probe("fairshare.cli", GRPC_EXPERIMENTS="").stdout.strip() == repr("")


def test_the_client_library_alone_changes_nothing() -> None:
    assert probe("fairshare.client").stdout.strip() == "None"


def test_too_late_once_grpc_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    import grpc  # noqa: F401 (imported in this process: the switch comes too late)

    monkeypatch.delenv(polling.EXPERIMENTS_VARIABLE, raising=False)
    assert polling.use_polling_thread() is False
    assert os.environ[polling.EXPERIMENTS_VARIABLE] == polling.POLLING_THREAD


def test_a_child_gets_the_switch_unless_its_environment_has_one() -> None:
    assert polling.polling_environment({"A": "1"}) == {
        "A": "1",
        polling.EXPERIMENTS_VARIABLE: polling.POLLING_THREAD,
    }
    assert polling.polling_environment({polling.EXPERIMENTS_VARIABLE: "x"}) == {
        polling.EXPERIMENTS_VARIABLE: "x"
    }
