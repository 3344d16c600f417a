"""The `messenger` command (`cli`) and what it runs: the embedded local endpoint (`local`), the
`Requeuer` (`requeue`), `top`, `emr`, and a local Slack webhook sink for tests and the demo
(`webhook_sink`). Tools may import every other layer; nothing imports them."""
