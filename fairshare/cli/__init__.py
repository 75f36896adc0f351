"""The ``fairshare`` command: serve a replica, inspect and steer running ones, simulate.

- ``main``: the argument parser and the entry point of the console script
  (``[project.scripts] fairshare``) and of ``python -m fairshare.cli``.
- ``client_commands``: ``status``, ``pools``, ``set-capacity`` and ``switchover``, which
  call a running allocator over gRPC, and their output formats.

This package sits on top: it imports ``server`` (``serve`` runs ``server.app``) and ``sim``
(``simulate``); nothing in the project imports it.
"""
