"""Example channels, producers and consumers: what `make demo` runs and the CDK app deploys."""
