"""Fault injection for the fault suite: pods, faults, the network proxy (`proxy`)."""
