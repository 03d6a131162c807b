"""A candidate's state in the coherence statistic (:mod:`gpufleet.correlate.coherence`): its witnesses
and supporting symptoms inside the window, kept as an object (:class:`Cand`) only once it needs one — a
candidate with one witness on one symptom stays an atomic tuple (:data:`Once`) that the cycle collector
stops tracking (decision 0106)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.correlate.model import SymptomKey


@dataclass(slots=True)
class Cand:
    # witness -> (last time, units, last minute, a reporter behind it: rates leave explained reporters out)
    wit: dict[str, tuple[float, int, int, str]]
    keys: dict[SymptomKey, float]  # supporting symptoms -> last time
    cls: str = ""
    units: int = 1  # sum of the witnesses' units (kept as they change, not summed per event)
    oldest: float = math.inf  # at most the oldest witness's last time: none expired while it is in the window
    significant: bool = False
    log_p: float = 0.0
    basis: str = ""  # FOLLOWS / STAYS: significant with the pattern kept from before a move


# A candidate with one witness and one supporting symptom, never scored (screened out: most are, and
# most never get a second witness), is kept as one tuple, (last time, last minute, witness, reporter,
# symptom key, units): atomic, so the cycle collector stops tracking it. It becomes a Cand when a
# second witness or symptom comes, when its witness comes back after the window, or when it must be
# scored.
Once = tuple[float, int, str, str, SymptomKey, int]


def cand_of(once: Once, cls: str) -> Cand:
    """The Cand a candidate kept as a tuple stands for."""
    t, minute, w, reporter, key, units = once
    return Cand({w: (t, units, minute, reporter)}, {key: t}, cls, units, t)


def prune(st: Cand, cutoff: float) -> None:
    """Forget ``st``'s witnesses last seen before ``cutoff``; ``oldest`` becomes exact again."""
    wit = st.wit
    for w in [w for w, v in wit.items() if v[0] < cutoff]:
        st.units -= wit.pop(w)[1]
    st.oldest = min((v[0] for v in wit.values()), default=math.inf)

