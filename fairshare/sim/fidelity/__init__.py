"""Replays of seeded traces through one simulated instance, to compare with vLLM's own scheduler.

- ``trace``: the traces (seeded, JSON), the per-step event logs, their comparison and the
  figures read from a log.
- ``replay``: a trace through one ``instance.Instance`` (1 s steps, no prefill time).

vLLM's side runs in a virtualenv of its own (``bench/fidelity_vllm.py``); nothing here
imports vLLM.
"""
