"""Synthesis time of the CDK app for 10 and 100 channels (target: 100 <= 6x of 10, <= 90 s).

Each size runs in its own Python process (a fresh jsii runtime, so one run does not warm the
next): the platform stack plus a channel stack holding N channels (every fourth a single queue,
the others on ten exchanges, a third with a filter) in channel stacks of 50 (CloudFormation's
500-resource limit), one consumer per exchange, a dashboard per stack and the cdk-nag
AwsSolutions pack, as `app.py` composes them. The timed part is building the
constructs and `app.synth()` (nag included); interpreter start and imports are reported apart.
CloudFormation's built-in template validation is reported separately (`--with-cfn-validation`),
as `cdk synth` runs it by default.

    python bench/synth.py [--sizes 10 100] [--with-cfn-validation]

Prints JSON: {"channels_10_s": ..., "channels_100_s": ..., "ratio": ..., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXCHANGES = 10
#: CloudFormation allows 500 resources per stack; a channel is 5 (see ChannelStack).
CHANNELS_PER_STACK = 50


def build_and_synth(channels: int, outdir: str, cfn_validation: bool) -> dict[str, float]:
    """Runs in the child process: import, build N channels, synthesize; returns timings."""
    started = time.perf_counter()
    import aws_cdk as cdk
    from cdk_nag import AwsSolutionsChecks

    from messenger.channel import ChannelSpec, MessageFilter
    from stacks.channel_stack import ChannelStack
    from stacks.config import MessengerConfig
    from stacks.platform_stack import PlatformStack

    imported = time.perf_counter()
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    app = cdk.App(outdir=outdir, context=context,
                  builtin_cloud_formation_validation=cfn_validation)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    config = MessengerConfig(namespace="bench", account="123456789012", region="eu-west-1",
                             pipeline=False, example_channels=False)
    env = cdk.Environment(account=config.account, region=config.region)
    platform = PlatformStack(app, "bench-MessengerPlatform", config=config, env=env)
    consumed: set[str] = set()
    channel_stacks: list[ChannelStack] = []
    # The consumers' own code folder, as a team has it: one class per consumed channel (the
    # topology lint imports them at synth).
    code = Path(outdir) / "code" / "bench_consumers"
    code.mkdir(parents=True)
    classes = ["from messenger import Consumer, MessageFilter\n"]
    for n in range(channels):
        if n % CHANNELS_PER_STACK == 0:
            channel_stacks.append(ChannelStack(
                app, f"bench-MessengerChannels{len(channel_stacks)}", platform=platform,
                code=code,
            ))
        stack = channel_stacks[-1]
        if n % 4 == 3:
            spec = ChannelSpec(f"queue{n}")
        else:
            exchange = f"events{n % EXCHANGES}"
            message_filter = MessageFilter("prefix", [f"K{n}."]) if n % 3 == 0 else None
            spec = ChannelSpec(f"{exchange}.consumer{n}", message_filter=message_filter)
        channel = stack.add_channel(spec)
        if spec.exchange and spec.exchange not in consumed:
            consumed.add(spec.exchange)
            stack.add_consumer(channel, f"bench_consumers.consumers:Consumer{n}")
            declared = (f"    message_filter = MessageFilter('prefix', {[f'K{n}.']!r})\n"
                        if message_filter else "")
            classes.append(f"\nclass Consumer{n}(Consumer):\n    channel = {spec.name!r}\n"
                           f"{declared}\n    def handler(self, message):\n        pass\n")
    (code / "consumers.py").write_text("\n".join(classes))
    built = time.perf_counter()
    app.synth()
    synthesized = time.perf_counter()
    resources = sum(
        len(json.loads(path.read_text())["Resources"])
        for path in Path(outdir).glob("bench-MessengerChannels*.template.json")
    )
    return {
        "import_s": imported - started,
        "build_s": built - imported,
        "synth_s": synthesized - built,
        "timed_s": synthesized - imported,
        "resources": resources,
        "stacks": len(channel_stacks),
    }


def measure(channels: int, cfn_validation: bool) -> dict[str, float]:
    """One child process per size; returns its timings and its wall-clock time."""
    with tempfile.TemporaryDirectory(prefix="messenger-bench-synth-") as outdir:
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, __file__, "--child", str(channels), outdir]
            + (["--with-cfn-validation"] if cfn_validation else []),
            cwd=REPO, capture_output=True, text=True,
            env={**os.environ, "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
                 "PYTHONPATH": str(REPO)},
            check=False,
        )
        wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"synthesis of {channels} channels failed:\n{result.stderr[-4000:]}")
    timings = json.loads(result.stdout.strip().splitlines()[-1])
    timings["wall_s"] = wall
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[10, 100])
    parser.add_argument("--with-cfn-validation", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        channels, outdir = int(args.child[0]), args.child[1]
        print(json.dumps(build_and_synth(channels, outdir, args.with_cfn_validation)))
        return
    small, large = args.sizes
    runs = {n: measure(n, args.with_cfn_validation) for n in (small, large)}
    ratio = runs[large]["timed_s"] / runs[small]["timed_s"]
    print(json.dumps({
        f"channels_{small}_s": round(runs[small]["timed_s"], 2),
        f"channels_{large}_s": round(runs[large]["timed_s"], 2),
        "ratio": round(ratio, 2),
        "target": {"ratio_max": 6, f"channels_{large}_s_max": 90},
        "meets_target": ratio <= 6 and runs[large]["timed_s"] <= 90,
        "cfn_validation": args.with_cfn_validation,
        "details": {str(n): {k: round(v, 2) if isinstance(v, float) else v
                             for k, v in r.items()} for n, r in runs.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
