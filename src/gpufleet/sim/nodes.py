"""The simulated fleet's node bookkeeping: job slots, spares, nodes in repair.

Nodes are small integers (names ``node00042`` only at the control seam). The job has a fixed number
of *slots*; a failed node leaves its slot empty until a spare fills it. With ``unlimited`` spares a
fresh node is created whenever the pool is empty. Every removal bumps the node's *epoch*, so a
fault or warning drawn for an earlier incarnation of the node is recognised as stale.
"""

from __future__ import annotations

IN_JOB, SPARE, REPAIR = range(3)


class NodePool:
    def __init__(self, job_nodes: int, spares: int, *, unlimited: bool, nodes_per_rack: int = 0) -> None:
        total = job_nodes + spares
        self.j = job_nodes
        self.unlimited = unlimited
        self.per_rack = nodes_per_rack
        self.status = [IN_JOB] * job_nodes + [SPARE] * spares
        self.epoch = [0] * total
        self.slot_of = list(range(job_nodes)) + [-1] * spares
        self.slots = list(range(job_nodes))
        self.empty: list[int] = []
        self.spares = list(range(job_nodes, total))
        self.in_repair = 0
        self.peak_in_repair = 0
        self._names: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.status)

    def name(self, node: int) -> str:
        n = self._names.get(node)
        if n is None:
            n = self._names[node] = f"node{node:05d}"
        return n

    def domains(self, node: int, slot: int) -> frozenset[str]:
        """A node's failure domains: its rack (job slots fill racks in order; spares sit apart)."""
        if self.per_rack <= 0:
            return frozenset()
        if slot >= 0:
            return frozenset({f"rack:r{slot // self.per_rack:05d}"})
        return frozenset({f"rack:s{node // self.per_rack:05d}"})

    def exposed(self) -> int:
        """How many positions the failure stream is thinned over (job slots, or every node)."""
        return self.j if self.unlimited else len(self.status)

    def at(self, pick: int) -> int:
        """The node at exposed position ``pick``, or -1 when it is empty or in repair."""
        node = self.slots[pick] if self.unlimited else pick
        if node < 0 or self.status[node] == REPAIR:
            return -1
        return node

    def remove(self, node: int) -> bool:
        """Send ``node`` to repair (False when it already is there)."""
        if self.status[node] == REPAIR:
            return False
        if self.status[node] == IN_JOB:
            slot = self.slot_of[node]
            self.slots[slot] = -1
            self.slot_of[node] = -1
            self.empty.append(slot)
        else:
            self.spares.remove(node)
        self.status[node] = REPAIR
        self.epoch[node] += 1
        self.in_repair += 1
        self.peak_in_repair = max(self.peak_in_repair, self.in_repair)
        return True

    def returned(self, node: int) -> None:
        """Repair finished and the node was accepted back: it becomes a spare."""
        self.status[node] = SPARE
        self.spares.append(node)

    def repair_over(self) -> None:
        self.in_repair -= 1

    def fill(self) -> tuple[bool, list[tuple[int, int]]]:
        """Put spares into empty job slots. Returns whether the job has all its nodes, and the
        (node, slot) pairs of nodes created for it (unlimited spares)."""
        created: list[tuple[int, int]] = []
        while self.empty:
            slot = self.empty[-1]
            if self.spares:
                node = self.spares.pop()
            elif self.unlimited:
                node = len(self.status)
                self.status.append(SPARE)
                self.epoch.append(0)
                self.slot_of.append(-1)
                created.append((node, slot))
            else:
                return False, created
            self.empty.pop()
            self.slots[slot] = node
            self.slot_of[node] = slot
            self.status[node] = IN_JOB
        return True, created
