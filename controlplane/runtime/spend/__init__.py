"""Spend and limits: prices, budgets and their checks, usage read back from the store,
and the concurrency admission that queues activations past a limit.
"""
