"""Several controller replicas on one PostgreSQL: one leader, elected with a lease row; its writes fenced
by the lease's epoch (docs/decisions/0100-leader-election-and-fencing.md)."""
