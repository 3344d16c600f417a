"""`ChannelDashboard`: one CloudWatch dashboard per stack with a row per channel."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from stacks.channel import Channel

PERIOD = Duration.minutes(5)


class ChannelDashboard(Construct):
    """Per channel: queue depth, age of the oldest message, DLQ depth.

    dashboard_name: the dashboard's name (letters, digits, '-', '_').
    """

    def __init__(self, scope: Construct, id: str, *, dashboard_name: str) -> None:
        super().__init__(scope, id)
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        self.channels: list[str] = []

    def add_channel(self, channel: Channel) -> None:
        """Append the channel's row (one row per priority level)."""
        self.channels.append(channel.spec.name)
        for level in channel.levels:
            name = level.spec.name
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title=f"{name}: depth",
                    left=[level.queue.metric_approximate_number_of_messages_visible(
                        period=PERIOD, statistic="Maximum", label="visible"
                    )],
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title=f"{name}: age of oldest message (s)",
                    left=[level.queue.metric_approximate_age_of_oldest_message(
                        period=PERIOD, statistic="Maximum", label="age"
                    )],
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title=f"{name}: DLQ depth",
                    left=[level.dlq.metric_approximate_number_of_messages_visible(
                        period=PERIOD, statistic="Maximum", label="dead letters"
                    )],
                    width=8,
                ),
            )
