"""Repair executors: what carries out a rung of the repair escalation ladder (docs/lifecycle.md)."""
