"""Approvals: a child's request to run a tool, the answer taken once from any runtime,
and the parked runs an answer continues.
"""
