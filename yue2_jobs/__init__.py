"""yue2-jobs: batch inference around the YuE2 hybrid AR-NAR decoder."""

__version__ = "0.1.0"
