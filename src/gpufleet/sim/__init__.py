"""Discrete-event simulator driving the production lifecycle code on a simulated clock, fleet and scheduler."""
