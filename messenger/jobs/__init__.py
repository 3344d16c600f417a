"""Opt-in job-queue features shared by producers and consumers: priority levels (`priority`) and
the message status store (`status`). Depends only on the core."""
