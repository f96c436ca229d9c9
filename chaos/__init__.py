"""Fault injection and bad input against real processes on loopback (``make chaos``).

Every scenario starts its own Kafka and worker processes, injects one kind of fault,
and returns its figures; ``python -m chaos`` runs them all and writes
``chaos/results/summary.md`` and ``summary.json``. The integration tests
``tests/integration/test_chaos_*.py`` run the same scenarios at a smaller size.
"""
