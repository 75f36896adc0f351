"""What a release charges: the rule every front of the allocator applies (``fairshare
gateway``, docs/gateway.md "Cost units"; the LiteLLM callback, docs/litellm.md).

- ``tokens``: ``prompt_weight × prompt_tokens + completion_weight × completion_tokens``,
  from the upstream's ``usage``; when it sent none (a request cut short), from the tokens
  the front counted so far or, with nothing seen, 0 completion tokens and the estimated
  prompt (the front fills that in); a ``usage`` of None charges 0.
- ``seconds``: the upstream's wall time, from sending the request to its last byte (or to
  the moment it was cut), whatever the tokens.

A request that never reached an upstream (refused before, no connection accepted, or
re-decided) charges 0; in ``tokens``, so does one the upstream answered with an error
status (no ``usage``). The charge is never negative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

COST_UNITS: Final = ("tokens", "seconds")
"""The units a release may charge in."""


@dataclass(frozen=True)
class Usage:
    """Tokens an upstream reported (or a front counted)."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class CostSettings:
    """What a release charges: the unit (one of ``COST_UNITS``) and, in ``tokens``, the
    weight of a prompt token and of a completion token."""

    unit: str = "tokens"
    prompt_weight: float = 1.0
    completion_weight: float = 1.0


def charge(settings: CostSettings, *, usage: Usage | None, upstream_s: float) -> float:
    """The consumption to release with (never negative)."""
    if settings.unit == "seconds":
        return max(upstream_s, 0.0)
    if usage is None:
        return 0.0
    return max(
        settings.prompt_weight * usage.prompt_tokens
        + settings.completion_weight * usage.completion_tokens,
        0.0,
    )
