"""What every run directory shares, beneath eval and train: durable owner-only writes
(``durable.py``), the redacted run log ``logs.txt`` (``logs.py``), the timestamp format
(``timestamps.py``) and where a config's dataset is found (``datasets.py``).
"""
