"""What a hosted LM would charge for the tokens an evaluation used: prices per million input (prompt) and
output (completion) tokens, and the cost of 1,000 dialogues at them.

The embedded model costs nothing per call; these numbers say what the same calls would cost on a hosted
model billed per token. The defaults are an example list price of a small hosted model (USD 0.15 per
million input tokens, 0.60 per million output tokens); set your provider's with ``--price-input`` and
``--price-output``. Every record that shows a cost states the prices it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_INPUT_PRICE = 0.15  # USD per million input (prompt) tokens
DEFAULT_OUTPUT_PRICE = 0.60  # USD per million output (completion) tokens
DIALOGUES = 1000  # costs are given per this many dialogues
# The summary key of the cost, and the per-dialogue token counts it is computed from.
COST_KEY = "cost_per_1000_dialogues"
TOKEN_KEYS = ("prompt_tokens_per_dialogue", "completion_tokens_per_dialogue")


class PriceError(ValueError):
    """A price that is not a finite number >= 0."""


def check_price(value: Any, what: str = "price") -> float:
    """``value`` as a price in USD per million tokens; PriceError, naming ``what``, unless it is a finite
    number >= 0 (a string such as ``"0.15"`` is read as a number)."""
    if isinstance(value, bool):
        raise PriceError(f"{what} must be a number of USD per million tokens, such as 0.15, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PriceError(f"{what} must be a number of USD per million tokens, such as 0.15, not {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise PriceError(f"{what} must be a finite number >= 0 (USD per million tokens), not {value!r}")
    return number


@dataclass(frozen=True)
class Pricing:
    """Prices in USD per million input and output tokens."""

    input_per_million: float = DEFAULT_INPUT_PRICE
    output_per_million: float = DEFAULT_OUTPUT_PRICE

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_per_million", check_price(self.input_per_million, "the input price"))
        object.__setattr__(self, "output_per_million", check_price(self.output_per_million, "the output price"))

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """USD for ``prompt_tokens`` input and ``completion_tokens`` output tokens."""
        return (prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million) / 1_000_000

    def per_dialogues(self, summary: dict[str, Any]) -> float | None:
        """USD for ``DIALOGUES`` dialogues at an evaluation summary's tokens per dialogue; None without them."""
        prompt, completion = (summary.get(k) for k in TOKEN_KEYS)
        if prompt is None or completion is None:
            return None
        return DIALOGUES * self.cost(prompt, completion)

    def to_dict(self) -> dict[str, Any]:
        """For records: the prices, their unit, and what the cost is per."""
        return {"currency": "USD", "unit": "per million tokens", "input_per_million": self.input_per_million,
                "output_per_million": self.output_per_million, "cost_per": f"{DIALOGUES} dialogues"}

    def describe(self) -> str:
        """``USD 0.15 per million input tokens, 0.60 per million output tokens``."""
        return (f"USD {self.input_per_million:g} per million input tokens, {self.output_per_million:g} per "
                "million output tokens")


__all__ = ["COST_KEY", "DEFAULT_INPUT_PRICE", "DEFAULT_OUTPUT_PRICE", "DIALOGUES", "PriceError", "Pricing",
           "check_price"]
