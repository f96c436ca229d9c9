"""Benchmarks: every scenario of the project next to its baselines, on a real local Kafka.

python -m bench            # the full run (make bench)
python -m bench --quick    # a smoke run of a few minutes
"""
