"""A vLLM scheduling simulator that shows what each team gets from fairshare priorities.

- ``engine``: a discrete-event model of a pool of k vLLM instances (C slots in all)
  behind gateway replicas that route with ``fairshare.routing``.
- ``instance``: one vLLM instance's scheduler: vLLM v1's rules (heap on
  ``(priority, arrival)``, ``max_num_seqs``, a KV-block budget whose preempted requests
  keep their tokens), and where each was read.
- ``model``: a request, the hardware (timing and KV cache) and the scheduling policy.
- ``allocators``: what the scheduler asks before and after a request (FCFS, or a
  ``fairshare.Pool`` on simulated time, that pool with a lending limit and its refused
  borrowers held at the gateway, or that pool with the standing rule it had before).
- ``results``: what a run recorded, and the waits and service read from it.
- ``holdings``: each team's requests in flight, within share and running, sampled over a
  run.
- ``workloads``: arrival processes (Poisson, bursts, floods) and request shapes.
- ``scenarios``: the scenarios of ``docs/simulation.md``, with figures and targets (one
  module per family, and the registry of their command-line names).
- ``plots``: PNG plots (matplotlib, imported lazily).
- ``report``: the markdown report.
- ``remote``: ``GrpcAllocator``, priorities from a running allocator over gRPC
  (``--allocator``), instead of the in-process pool.
- ``command``: ``fairshare simulate`` / ``python -m fairshare.sim``.
- ``standin``: a stand-in vLLM server (``python -m fairshare.sim.standin``, aiohttp): the OpenAI
  subset, a running limit in priority or fcfs order, a record of every request.

Importing this package needs only ``fairshare``; plotting needs matplotlib; ``remote``
needs the gRPC client (``client``); ``standin`` needs aiohttp (the ``gateway`` extra).
"""
