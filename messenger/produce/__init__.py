"""The producing side: `Producer` / `MultiProducer`, batch push (`push_many`) and the transports
(an SQS queue or an SNS topic). What a Spark executor or a Lambda needs: it imports only the core
and `messenger.jobs.status`, never the consumer runtime."""
