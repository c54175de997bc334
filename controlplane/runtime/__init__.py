"""The runtime: the facade (`SubagentControl`) and what it wires — the Task service, the
lease, routing, spend and approvals — each in its wing. Imports run one way: a wing
imports the layers below (actors, persistence, contract, telemetry, providers), the
runtime's shared modules and the wings it declares (tests/test_layering.py); the
facade at the top imports them all; nothing below imports the runtime.
"""
