"""What every run directory shares, beneath eval and train: durable owner-only writes
(``durable.py``) and the timestamp format (``timestamps.py``).
"""
