"""The Task service: what parents observe of activations (fenced by owner session) and
the book of live Tasks the actors and the runtime write through.
"""
