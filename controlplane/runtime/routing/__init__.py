"""Where a send goes: this process's supervisor, another runtime (forwarded through the
store's inbox, and answered there), or a takeover of a dead runtime's child.
"""
