"""The consuming side: `Consumer` (consumer.py) and its runtime.

`runtime` runs a receiver and workers against a `mailbox` (the SQS calls on one queue), `levels`
polls a prioritized channel's queues, `watchdog` extends leases and times out handlers, `host` is
the interface the runtime needs of a consumer, `lifecycle` holds states, hooks and events, `health`
the health file and the container's health check, `settings` the process settings, `tracking` the
status records of a tracked channel. `lambda_runtime` runs the same consumer class in AWS Lambda, on
the batches of an SQS event source.
"""
