"""A stand-in for vLLM's OpenAI-compatible server, for the gateway's tests, the demo and
the benchmark: the same endpoints and answer shapes (chat, completions, responses,
embeddings), tokens at a set pace, a running limit
with vLLM's priority or fcfs order, and a record of every request (``fairshare.sim.standin.app``).
Run it with ``python -m fairshare.sim.standin --listen HOST:PORT``.
"""
