"""Protocol fronts: the control plane served to clients that speak MCP or A2A (SPEC §12)."""
