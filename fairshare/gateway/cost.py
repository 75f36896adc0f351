"""What a release charges, in the configured unit (docs/gateway.md, "Cost units").

- ``tokens``: ``prompt_weight × prompt_tokens + completion_weight × completion_tokens``,
  from the upstream's ``usage``; when it sent none (a request cut short), from the tokens
  counted so far (``fairshare.gateway.body.StreamFilter.counted``) or, with nothing seen, 0
  completion tokens and the estimated prompt (``fairshare.gateway.proxy`` fills that in); a
  ``usage`` of None charges 0.
- ``seconds``: the upstream's wall time, from sending the request to its last byte (or to
  the moment it was cut), whatever the tokens.

A request that never reached an upstream (refused before, no connection accepted, or
re-decided) charges 0; in ``tokens``, so does one the upstream answered with an error
status (no ``usage``).
"""

from __future__ import annotations

from fairshare.gateway.body import Usage
from fairshare.gateway.config import CostSettings


def charge(settings: CostSettings, *, usage: Usage | None, upstream_s: float) -> float:
    """The consumption to release with."""
    if settings.unit == "seconds":
        return max(upstream_s, 0.0)
    if usage is None:
        return 0.0
    return (
        settings.prompt_weight * usage.prompt_tokens
        + settings.completion_weight * usage.completion_tokens
    )
