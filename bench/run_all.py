"""`make bench`: run every benchmark script in one go and write bench/RESULTS.md.

Each script runs in its own process and prints a JSON object (the last JSON object on stdout is
taken); this script picks the headline figures, compares them with the targets and writes a
Markdown report with the machine and the date. Ratios are measured within one run of a script.

    python bench/run_all.py [--only cost consume ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


@dataclass(frozen=True)
class Figure:
    """One headline number: where it is in the script's JSON, its target and the comparison."""

    label: str
    path: tuple[str, ...]
    target: float | None = None
    at_most: bool = True  # True: value <= target passes; False: value >= target passes


@dataclass(frozen=True)
class Bench:
    script: str
    what: str
    figures: tuple[Figure, ...]
    args: tuple[str, ...] = ()


BENCHES = (
    Bench("cost.py", "Producer requests per message over 1,000 messages", (
        Figure("push (queue)", ("bench_orders.push", "requests_per_message")),
        Figure("push_many (queue)", ("bench_orders.push_many", "requests_per_message"), 0.11),
        Figure("push (exchange)", ("bench_events.push", "requests_per_message")),
        Figure("push_many (exchange)", ("bench_events.push_many", "requests_per_message"), 0.11),
        Figure("push_many (queue), tracing off, SDK installed",
               ("tracing", "push_many.off", "requests_per_message"), 0.11),
        Figure("push_many (queue), tracing on", ("tracing", "push_many.on",
                                                 "requests_per_message"), 0.11),
        Figure("push (queue), tracing on", ("tracing", "push.on", "requests_per_message")),
        Figure("producer CPU µs per message tracing adds, push",
               ("tracing", "push.cpu_us_added_by_tracing")),
        Figure("producer CPU µs per message tracing adds, push_many",
               ("tracing", "push_many.cpu_us_added_by_tracing")),
    )),
    Bench("consume.py", "Consumer requests per message, 1,000-message backlog, concurrency 10", (
        Figure("consume", ("requests_per_message",), 0.25),
        Figure("consumer CPU µs per message tracing adds (SDK, in-memory exporter)",
               ("tracing", "cpu_us_added_by_tracing")),
    )),
    Bench("peers.py", "Consumer vs aws-sqs-consumer, same backlog, alternating rounds", (
        Figure("CPU ratio messenger/peer", ("cpu_ratio",), 1.0),
        Figure("CPU ratio to the peer reading the same attributes",
               ("cpu_ratio_same_attributes",)),
        Figure("messenger CPU s per 1,000 (median)", ("messenger", "cpu_seconds_per_1000")),
        Figure("peer CPU s per 1,000 (median)", ("peer", "cpu_seconds_per_1000")),
        Figure("messenger requests per message", ("messenger", "requests_per_message"), 0.22),
        Figure("rounds (each pairs the drains run back to back)", ("rounds",)),
        Figure("load average during the rounds (median)", ("load_average", "median")),
    )),
    Bench("throughput.py", "I/O-bound handlers: 500 messages, concurrency 10, vs a boto3 loop "
                           "with a thread pool, alternating rounds", (
        *(figure for ms, limit in ((10, "1,000"), (50, "200"), (200, "50")) for figure in (
            Figure(f"{ms} ms handler: messenger, share of the limit ({limit} msg/s)",
                   (f"handler_{ms}ms", "messenger", "fraction_of_limit"), 0.85, at_most=False),
            Figure(f"{ms} ms handler: peer, share of the limit",
                   (f"handler_{ms}ms", "boto3_pool", "fraction_of_limit")),
            Figure(f"{ms} ms handler: msg/s and push-to-start latency",
                   (f"handler_{ms}ms", "summary")),
        )),
        *(figure for ms, limit in ((10, "1,000"), (50, "200"), (200, "50")) for figure in (
            Figure(f"{ms} ms handler, 20 ms round trip added: messenger, share of the limit",
                   ("rtt_20ms", f"handler_{ms}ms", "messenger", "fraction_of_limit"), 0.85,
                   at_most=False),
            Figure(f"{ms} ms handler, 20 ms round trip added: peer, share of the limit",
                   ("rtt_20ms", f"handler_{ms}ms", "boto3_pool", "fraction_of_limit")),
        )),
        Figure("10 ms: one receiver's bound here (10 messages per receive round trip), share "
               "of the limit", ("handler_10ms", "one_receiver", "bound_fraction_of_limit")),
        Figure("10 ms: messenger, share of that bound",
               ("handler_10ms", "one_receiver", "messenger_fraction_of_bound")),
        Figure("10 ms: messenger ÷ messenger with one receive in flight, msg/s",
               ("handler_10ms", "ratio_to_one_receive")),
        Figure("10 ms, 20 ms round trip added: messenger ÷ one receive in flight, msg/s",
               ("rtt_20ms", "handler_10ms", "ratio_to_one_receive")),
        Figure("10 ms: local endpoint's CPU share of one core while messenger drains",
               ("handler_10ms", "messenger", "endpoint_cpu_share")),
        Figure("messenger requests per message, 50 ms handler",
               ("handler_50ms", "messenger", "requests_per_message"), 0.25),
    )),
    Bench("offload.py", "Offloaded payloads, 20 × 600 KiB through S3, vs AWS's "
                        "amazon-sqs-extended-client, alternating rounds (medians)", (
        Figure("send time ratio messenger/peer", ("send_ratio",), 1.0),
        Figure("receive window ratio messenger/peer", ("receive_ratio",), 1.0),
        Figure("messenger send / receive window (s)", ("messenger", "send_and_receive")),
        Figure("peer send / receive window (s)", ("peer", "send_and_receive")),
    )),
    Bench("spark_publish.py", "Spark publish from executors", (
        Figure("requests per message", ("conditions", "network_10ms", "requests_per_message"),
               0.11),
        Figure("speed vs per-row push, 10 ms round trip per request",
               ("conditions", "network_10ms", "speedup_vs_push"), 5, at_most=False),
        Figure("speed vs per-row push, bare loopback (moto's CPU bound)",
               ("conditions", "loopback", "speedup_vs_push")),
    )),
    Bench("spark_rerun.py", "Spark re-run of a finished run (same run key), 5,000 rows", (
        Figure("speed-up of a re-run that skips everything over the run (median)",
               ("conditions", "loopback", "speedup_median"), 10, at_most=False),
        Figure("DynamoDB requests per row, first run",
               ("conditions", "loopback", "dynamodb_requests_per_row"), 1.1),
    )),
    Bench("threshold.py", "Offload threshold in dollars per million messages, standard queue, "
                          "beside amazon-sqs-extended-client (offloads above 256 KiB)", (
        Figure("512 KiB: messenger (default 1 MiB)",
               ("measured", "512 KiB", "messenger_after", "dollars_per_million")),
        Figure("512 KiB: extended client",
               ("measured", "512 KiB", "extended_client", "dollars_per_million")),
        Figure("1 MiB: messenger (default 1 MiB)",
               ("measured", "1 MiB", "messenger_after", "dollars_per_million")),
        Figure("1 MiB: extended client",
               ("measured", "1 MiB", "extended_client", "dollars_per_million")),
    )),
    Bench("ops.py", "Ops Lambda API calls over 1,000 queues", (
        Figure("queue alarm calls, source scope (+1 secret read)", ("queue_alarm.source",
                                                                    "aws_calls"), 24),
        Figure("queue alarm calls, DLQ scope (+1 secret read)", ("queue_alarm.dlq", "aws_calls"),
               24),
        Figure("queue alarm calls, source scope, +3 CloudFormation +3 cost tags",
               ("queue_alarm.source.cloudformation_and_cost_tags", "aws_calls"), 24),
        Figure("resource cleaner calls", ("resource_cleaner", "aws_calls")),
        Figure("resource cleaner CloudWatch calls", ("resource_cleaner", "cloudwatch_calls"),
               12),
    )),
    Bench("synth.py", "CDK synth time", (
        Figure("10 channels (s)", ("channels_10_s",)),
        Figure("100 channels (s)", ("channels_100_s",), 90),
        Figure("ratio 100/10", ("ratio",), 6),
    )),
    Bench("timeouts.py", "Processing timeouts under load: 1,000 handlers blocking 3 s on a 1 s "
                         "timeout, concurrency 200", (
        Figure("completed (deleted as success)", ("completed",), 0),
        Figure("marked timed out, s after the deadline, p90", ("marked_late_seconds", "p90")),
        Figure("timed out to dead-lettered, s, p90", ("forward_seconds", "p90")),
    )),
    Bench("status.py", "Status tracking on vs off, same run", (
        Figure("throughput ratio on/off (median of rounds)", ("throughput_ratio",), 0.9,
               at_most=False),
        Figure("throughput ratio on/off (pooled)", ("pooled_ratio",)),
        Figure("consumer CPU ratio off/on (median of rounds)", ("cpu_ratio",)),
        Figure("extra DynamoDB requests per message", ("dynamodb_requests_per_message",), 0.3),
        Figure("DynamoDB items written per job (consumer)", ("items_written_per_message",)),
    )),
    Bench("cold_start.py", "Lambda consumer cold start vs a minimal Powertools batch handler, "
                           "fresh interpreters, alternating rounds (medians)", (
        Figure("import + first invocation ratio messenger/peer", ("ratio",), 1.3),
        Figure("messenger import (ms)", ("messenger", "import_ms")),
        Figure("messenger first invocation (ms)", ("messenger", "first_invocation_ms")),
        Figure("peer import (ms)", ("peer", "import_ms")),
        Figure("peer first invocation (ms)", ("peer", "first_invocation_ms")),
        Figure("bundle (MiB)", ("bundle", "mib")),
    )),
    Bench("dollars.py", "Dollars per million jobs, all-in (wire-metered x list prices)", (
        Figure("plain channel $/M", ("plain", "dollars_per_million", "total")),
        Figure("job channel (status, dedup, idempotency) $/M",
               ("job", "dollars_per_million", "total")),
        Figure("job / plain", ("job_over_plain",), 1.5),
        Figure("exchange, 3 filtered queues $/M", ("exchange", "dollars_per_million", "total")),
        Figure("600 KiB offloaded $/M", ("offload_600k", "dollars_per_million", "total")),
        Figure("peer boto3 loop $/M", ("peers", "boto3_loop", "dollars_per_million", "total")),
        Figure("peer aws-sqs-consumer $/M",
               ("peers", "aws_sqs_consumer", "dollars_per_million", "total")),
        *(Figure(f"{who} at {rate}/s $/M", ("fleet", f"{who}.{rate}_per_s",
                                            "dollars_per_million", "total"))
          for rate in (10, 1000)
          for who in ("messenger.fargate", "boto3_loop.fargate", "aws_sqs_consumer.fargate",
                      "messenger.lambda", "powertools.lambda")),
    )),
    Bench("job_ops.py", "Dead-letter workbench on a 10,000-letter DLQ; dedup on enqueue", (
        Figure("dlq list: requests per dead letter", ("dlq", "requests_per_dead_letter"), 0.25),
        Figure("dlq list: seconds for 10,000", ("dlq", "list_seconds")),
        Figure("dlq requeue of one id: requests", ("dlq", "requeue_one_requests")),
        Figure("dedup on: extra requests per message (push_many)",
               ("dedup", "extra_requests_per_message_on"), 1.1),
        Figure("dedup on: extra requests per push", ("dedup", "extra_requests_per_push_on"), 2.0),
        Figure("dedup off: extra requests per message",
               ("dedup", "extra_requests_per_message_off"), 0.0),
    )),
    Bench("workflows.py", "Results and workflows: requests per job, producer and consumers", (
        Figure("plain job", ("kinds", "plain", "requests_per_job")),
        Figure("job with a result", ("kinds", "result", "requests_per_job")),
        Figure("group member (callback included)", ("kinds", "group_member",
                                                     "requests_per_job")),
        Figure("dependent job (its own)", ("kinds", "dependent", "requests_per_job")),
        Figure("dependent job: $ per million", ("kinds", "dependent",
                                                "dollars_per_million_jobs")),
    )),
    Bench("dashboard.py", "Dashboard on a 10,000-letter DLQ (one page, not the whole queue)", (
        Figure("channel page: ReceiveMessage calls (50 letters)", ("channel_page", "receives"),
               6),
        Figure("channel page (s)", ("channel_page", "seconds")),
        Figure("channel page of 100 (s)", ("channel_page_100", "seconds")),
        Figure("letter found mid-DLQ (s)", ("letter_deep", "seconds")),
        Figure("overview refresh: requests", ("overview_fragment", "requests")),
    )),
    Bench("lambda_consumer.py", "Lambda consumer runtime, batches of 10, per message", (
        Figure("function requests, handled", ("handled", "function_requests_per_message"), 0),
        Figure("function requests, failed (retry delay)",
               ("failed", "function_requests_per_message"), 1),
        Figure("function requests, undecodable (to the DLQ)",
               ("undecodable", "function_requests_per_message"), 2),
        Figure("CPU µs, handled", ("handled", "cpu_us_per_message")),
        Figure("CPU µs, Powertools' bare processor", ("handled",
                                                      "bare_powertools_cpu_us_per_message")),
    )),
    Bench("consumer_image.py", "Consumer image with podman (skipped without an engine)", (
        Figure("build (s)", ("build_s",)),
        Figure("image (MB)", ("image_mb",)),
        Figure("podman run to LISTENING (s)", ("run_to_listening_s",)),
        Figure("SIGTERM to exit (s)", ("sigterm_to_exit_s",)),
    )),
    Bench("local_endpoint.py", "Local endpoint SQS, depth 10,000 vs empty, same run", (
        Figure("indexed: worst ratio deep/empty", ("indexed_worst_ratio",), 2),
        Figure("indexed: batched send at depth (s)", ("indexed", "standard-deep", "send_batch")),
        Figure("indexed: receive at depth (s)", ("indexed", "standard-deep", "receive")),
        Figure("stock: batched send ratio deep/empty",
               ("stock", "standard.send_batch.ratio_deep_vs_empty")),
        Figure("stock: receive ratio deep/empty",
               ("stock", "standard.receive.ratio_deep_vs_empty")),
    )),
)


def last_json(text: str) -> dict[str, Any]:
    """The last complete JSON object in a script's stdout."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        if isinstance(value, dict):
            found = value
        index = text.find("{", end)
    if found is None:
        raise ValueError("no JSON object in the output")
    return found


def lookup(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def headline(value: Any) -> Any:
    """The number a figure is judged on: a figure over rounds (a dict with its median and
    spread, as bench/peers.py reports them) is judged on its median."""
    return value["median"] if isinstance(value, dict) and "median" in value else value


def shown(value: Any) -> str:
    """A figure as the table shows it; over rounds: the median, then the rounds' range and IQR."""
    if isinstance(value, dict) and "median" in value:
        return (f"{value['median']:g} (median of {len(value['rounds'])}; rounds {value['min']:g} "
                f"to {value['max']:g}, IQR {value['iqr']:g})")
    return f"{value:g}" if isinstance(value, float) else str(value)


def verdict(figure: Figure, value: Any) -> str:
    value = headline(value)
    if figure.target is None or not isinstance(value, (int, float)):
        return ""
    ok = value <= figure.target if figure.at_most else value >= figure.target
    return "met" if ok else "**missed**"


def run(bench: Bench, log: Callable[[str], None]) -> tuple[dict[str, Any] | None, float, str]:
    started = time.monotonic()
    log(f"running bench/{bench.script} ...")
    done = subprocess.run(
        [sys.executable, str(BENCH / bench.script), *bench.args],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"},
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        return None, took, done.stderr[-2000:]
    try:
        return last_json(done.stdout), took, ""
    except ValueError as error:
        return None, took, str(error)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def report(results: list[tuple[Bench, dict[str, Any] | None, float, str]]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (bench/run_all.py) on {now}; machine: {machine()}.",
        "Requests are counted with botocore's `before-send` event (retries included) against the",
        "embedded local endpoint (moto server in a child process); times are wall-clock on this",
        "machine and vary from run to run, request counts do not.",
        "",
        "| benchmark | figure | value | target | result |",
        "|-----------|--------|-------|--------|--------|",
    ]
    for bench, data, took, _ in results:
        if data is None:
            lines.append(f"| {bench.what} | (failed after {took:.0f} s) | - | - | **error** |")
            continue
        for figure in bench.figures:
            value = lookup(data, figure.path)
            target = "" if figure.target is None else (
                f"{'≤' if figure.at_most else '≥'} {figure.target:g}")
            lines.append(f"| {bench.what} | {figure.label} | {shown(value)} | {target} | "
                         f"{verdict(figure, value)} |")
    lines += ["", "## Raw output", ""]
    for bench, data, took, error in results:
        lines += [f"### bench/{bench.script} ({took:.0f} s)", "", "```json" if data else "```",
                  json.dumps(data, indent=2) if data else error.strip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="script names without .py (default: all)")
    parser.add_argument("--out", default=str(BENCH / "RESULTS.md"))
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHES if not args.only or b.script[:-3] in args.only]
    unknown = set(args.only or ()) - {b.script[:-3] for b in BENCHES}
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from "
                     f"{', '.join(b.script[:-3] for b in BENCHES)}")
    results = []
    for bench in chosen:
        if not (BENCH / bench.script).exists():
            results.append((bench, None, 0.0, "script missing"))
            continue
        data, took, error = run(bench, lambda text: print(text, flush=True))
        results.append((bench, data, took, error))
        print(f"  done in {took:.0f} s{'' if data else ' (FAILED)'}", flush=True)
    Path(args.out).write_text(report(results) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(data is not None for _, data, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
