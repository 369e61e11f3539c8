"""What runs inside a sandbox or container: the file contract between a backend on the host
and the runner next to the task (``files.py``), and the runner itself (``runner.py``).

Only the framework-neutral SDK core is imported here, so the runner works wherever the core
and the user's own code can be imported.
"""
