"""Token metering and per-question budgets."""

from __future__ import annotations

from dataclasses import dataclass

from corag.types import Usage


class BudgetExceeded(Exception):
    """A model call would pass the question's token budget, so it was not started."""


@dataclass
class Meter:
    """Tokens charged to one question, and the budget its calls must stay within.

    `reserve` tokens are held back for the final answer: ordinary calls may only use
    `budget - reserve`, calls marked final may use the whole budget. `pending` holds the worst
    cases of calls started but not yet charged, so concurrent calls of one question (best-of-N
    chains, tree-search rollouts) cannot together pass the budget.
    """

    budget: int | None = None
    reserve: int = 0
    usage: Usage = Usage()
    pending: int = 0

    def check(self, worst_case: int, *, final: bool = False) -> None:
        """Raise BudgetExceeded when a call costing up to `worst_case` tokens could pass the budget."""
        if self.budget is None:
            return
        limit = self.budget if final else self.budget - self.reserve
        if self.usage.total + self.pending + worst_case > limit:
            raise BudgetExceeded(
                f"call of up to {worst_case} tokens after {self.usage.total} (+{self.pending} in flight) "
                f"would pass {limit}"
            )

    def fits(self, tokens: int) -> bool:
        """Whether `tokens` more (on top of usage and calls in flight) stay within the whole budget."""
        return self.budget is None or self.usage.total + self.pending + tokens <= self.budget

    def charge(self, usage: Usage) -> None:
        self.usage = self.usage + usage

    @property
    def left(self) -> int | None:
        return None if self.budget is None else self.budget - self.usage.total
