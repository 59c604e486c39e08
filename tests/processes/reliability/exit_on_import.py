"""A module outside every installed app that stops the process importing it.

A job whose type names it must never make a worker import it (see test_poison_values.py).
"""

raise SystemExit(3)
