"""`messenger cost`: what each channel cost in the last day and the last 30 days (a view over
`messenger.ops.cost.channel_costs`).

    messenger cost orders          # one channel (an exchange: its topic and every queue of it)
    messenger cost --all           # every channel of the namespace, the most expensive first
    messenger cost --all --json    # the same as JSON, with the metrics summed

From CloudWatch's SQS and SNS metrics and the dated price table (`messenger.ops.prices`). SQS
bills requests, CloudWatch counts messages: each figure is a range, from every request carrying
a batch of 10 messages to each carrying one (empty receives are exact).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from typing import Any

from messenger.errors import InvalidSettings
from messenger.ops.cost import ChannelCost, Estimate, channel_costs
from messenger.ops.prices import PRICES_CHECKED, REGION
from messenger.tools.runtime import CommandRuntime


def dollars_text(low: float, high: float) -> str:
    """'$12.34', '$0.0000308' (3 significant digits below a dollar), or a range '$a-b'."""
    def one(value: float) -> str:
        if value >= 1:
            return f"{value:,.2f}"
        if value <= 0:
            return "0"
        decimals = 2 - math.floor(math.log10(value))
        return f"{value:.{decimals}f}".rstrip("0").rstrip(".")

    return f"${one(low)}" if one(low) == one(high) else f"${one(low)}-{one(high)}"


def requests_text(estimate: Estimate) -> str:
    low, high = round(estimate.requests_low), round(estimate.requests_high)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def render(costs: list[ChannelCost], namespace: str) -> str:
    header = (f"cost by channel, namespace {namespace or '(none)'}: {REGION} list prices of "
              f"{PRICES_CHECKED.isoformat()}, CloudWatch metrics")
    rows = [("channel", "owner", "requests 24 h", "24 h", "requests 30 d", "30 d")]
    for cost in costs:
        label = cost.channel + (" (exchange)" if cost.kind == "exchange" else "")
        rows.append((label, cost.owner or "-", requests_text(cost.day),
                     dollars_text(cost.day.dollars_low, cost.day.dollars_high),
                     requests_text(cost.month),
                     dollars_text(cost.month.dollars_low, cost.month.dollars_high)))
    widths = [max(len(row[n]) for row in rows) for n in range(len(rows[0]))]
    lines = [header] + ["  ".join(cell.ljust(w) if n < 2 else cell.rjust(w)
                                  for n, (cell, w) in enumerate(zip(row, widths, strict=True)))
                        for row in rows]
    lines.append("ranges: every request a batch of 10 .. one message each; not counted: lease "
                 "renewals, DynamoDB, S3, KMS, Lambda, Fargate")
    return "\n".join(lines)


def as_json(costs: list[ChannelCost]) -> list[dict[str, Any]]:
    return [{**asdict(cost), "prices_checked": PRICES_CHECKED.isoformat(), "region": REGION}
            for cost in costs]


def run_cli(args: argparse.Namespace) -> int:
    if bool(args.channel) == bool(args.all):
        raise InvalidSettings("cost: name one channel, or --all for every channel (not both)")
    runtime = CommandRuntime.from_env()
    costs = channel_costs(runtime.clients, runtime.settings,
                          None if args.all else args.channel)
    print(json.dumps(as_json(costs), indent=2) if args.json
          else render(costs, runtime.settings.namespace))
    return 0


def add_parser(commands: Any) -> None:
    cost = commands.add_parser(
        "cost", help="each channel's cost in the last day and 30 days (CloudWatch x list prices)")
    cost.add_argument("channel", nargs="?", help="a channel, prioritized channel or exchange")
    cost.add_argument("--all", action="store_true", help="every channel of the namespace")
    cost.add_argument("--json", action="store_true", help="print JSON, with the metrics summed")
    cost.set_defaults(run=run_cli)
