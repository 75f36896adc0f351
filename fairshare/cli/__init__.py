"""The ``fairshare`` command: serve a replica, inspect and steer running ones, simulate.

- ``main``: the argument parser and the entry point of the console script
  (``[project.scripts] fairshare``) and of ``python -m fairshare.cli``.
- ``client_commands``: ``status``, ``pools``, ``set-capacity`` and ``switchover``, which
  call a running allocator over gRPC, and their output formats.

This package sits on top: it imports ``server`` (``serve`` runs ``server.app``) and ``sim``
(``simulate``); nothing in the project imports it.

Importing it first chooses how the process's gRPC polls its sockets
(``fairshare.wire.polling``), before anything imports ``grpc``.
"""

from fairshare.wire.polling import use_polling_thread

use_polling_thread()
