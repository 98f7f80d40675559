"""Fault-injection tests: one fault at a time under continuous acks=all production (issue 13)."""
