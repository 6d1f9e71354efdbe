"""akm: a durable workflow engine for coding agents.

Kept deliberately import-light: the CLI imports this package on every start.
"""

__version__ = "0.1.0"
