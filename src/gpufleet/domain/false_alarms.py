"""The correlator's false-alarm budget: false verdicts per node-day its coherence statistic may cost.

One default and one validator for every way in: the policy file (``correlation_false_alarm_budget``),
the CLI (``--false-alarm-budget``) and the engine itself (docs/correlate.md §What the budget buys,
decision 0112).
"""

from __future__ import annotations

from gpufleet.domain.errors import InvalidInput

#: False verdicts per node-day the coherence statistic may cost, unless the operator sets another
#: (policy ``correlation_false_alarm_budget``, ``--false-alarm-budget``; docs/correlate.md).
FALSE_ALARM_BUDGET = 1e-3


#: The smallest budget accepted: one false verdict per billion node-days, far below any useful budget
#: (a candidate's alpha is then about 1e-19); a bound, so that a typo such as 1e-320 is refused by name
#: instead of failing deep in the statistic (a share of 0 has no logarithm).
MIN_FALSE_ALARM_BUDGET = 1e-9


def false_alarm_budget(value: object, field: str) -> float:
    """``value`` as a false-alarm budget (false verdicts per node-day, from 1e-9 to 1); else InvalidInput
    naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not MIN_FALSE_ALARM_BUDGET <= value <= 1:
        raise InvalidInput(field, value, "false verdicts per node-day from 1e-9 to 1, e.g. 0.001 (1 per 1,000 "
                                         "node-days)")
    return float(value)
