"""Node lifecycle: the state machine, the remediation policy and the blast-radius breaker (pure)."""
