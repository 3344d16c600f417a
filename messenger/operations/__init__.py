"""Operations on a namespace's channels, as a library: the `messenger` commands and the
dashboard are views over these public names.

    queues        a channel's queues, resolved exactly from the platform's tags
    snapshot      the queue snapshot behind `messenger top` and the dashboard's overview
    deadletters   the dead-letter workbench: list, show, requeue and delete single letters
    requeue       `Requeuer`: move a queue's messages (usually a DLQ's) back to a channel
    scheduled     `cancel_scheduled`: cancel scheduled jobs in bulk, one answer per job
"""
