"""This runtime in the store: its row, its heartbeat and lease, the watchdog that stops
it acting when it cannot renew, the judgement of other runtimes, the sweep that
recovers or settles what dead ones left running, and the expiry of their rows.
"""
