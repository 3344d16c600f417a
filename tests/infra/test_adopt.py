"""Redeploying a deleted stack: its retained, fixed-name resources are adopted, not in the way.

A channel stack's retained resources all carry static names, so `cdk deploy
--import-existing-resources` adopts them; the platform's key has no name, so `messenger adopt`
writes the mapping `cdk import` needs, looked up on the moto server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from messenger.aws import ClientFactory
from messenger.channel import lambda_consumer_prefix
from messenger.tools.cli import main
from tests.infra.conftest import ACCOUNT, NAMESPACE, REGION, CloudAssembly

#: What CloudFormation imports automatically (static name, Retain): the channel resources.
AUTO_IMPORTED = {"AWS::SQS::Queue": "QueueName", "AWS::SNS::Topic": "TopicName"}


def test_every_retained_channel_resource_can_be_adopted_by_name(assembly: CloudAssembly) -> None:
    # CloudFormation's auto-import needs a static custom name and DeletionPolicy Retain
    resources = assembly.template("examples")["Resources"]
    retained = {k: r for k, r in resources.items() if r.get("DeletionPolicy") == "Retain"}
    assert retained
    for logical_id, resource in retained.items():
        assert resource["Type"] in AUTO_IMPORTED, logical_id
        name = resource["Properties"][AUTO_IMPORTED[resource["Type"]]]
        assert isinstance(name, str) and name.startswith(f"{NAMESPACE}-"), logical_id
    # And nothing else in the stack has a fixed name that a leftover could block (an alarm's
    # MetricName names what it watches, not the alarm). Lambda consumer functions are named on
    # purpose ('<ns>-messenger-consumer-<construct path + hash>': the dashboard's pause may
    # update only their event source mappings, by lambda:FunctionArn); they are not retained,
    # so no leftover of the stack's own holds their name, and the hash keeps them unique.
    named = [k for k, r in resources.items()
             if any(p.endswith("Name") and isinstance(v, str)
                    and p not in ("PolicyName", "MetricName")
                    for p, v in r.get("Properties", {}).items())
             and r["Type"] not in ("AWS::ApplicationAutoScaling::ScalingPolicy",
                                   "AWS::CloudWatch::Dashboard")
             and not (r["Type"] == "AWS::Lambda::Function"
                      and r["Properties"].get("FunctionName", "").startswith(
                          lambda_consumer_prefix(NAMESPACE)))]
    assert set(named) <= set(retained), set(named) - set(retained)


def test_adopt_maps_the_platform_leftovers_for_cdk_import(
    assembly: CloudAssembly, endpoint: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given what a deleted platform stack leaves: its key (the alias went with the stack), the
    # offload bucket and the status table encrypted with it
    clients = ClientFactory(REGION)
    key = clients.client("kms").create_key(Description="old platform key")["KeyMetadata"]
    bucket = f"{NAMESPACE}-messenger-offload-{ACCOUNT}-{REGION}"
    s3 = clients.client("s3")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [{
        "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms",
                                               "KMSMasterKeyID": key["Arn"]}}]})
    clients.client("dynamodb").create_table(
        TableName=f"{NAMESPACE}-messenger-status", BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "message_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "message_id", "KeyType": "HASH"}],
    )
    template = assembly.outdir / f"{NAMESPACE}-MessengerPlatform.template.json"
    # When the mapping is written
    code = main(["adopt", str(template), "--region", REGION])
    out, err = capsys.readouterr()
    # Then it names each leftover by its import identifier, the key by its id
    assert code == 0, err
    mapping = json.loads(out)
    resources = assembly.template("platform")["Resources"]
    by_type = {resources[k]["Type"] + (":offload" if "Offload" in k else ""): v
               for k, v in mapping.items()}
    assert by_type == {
        "AWS::KMS::Key": {"KeyId": key["KeyId"]},
        "AWS::S3::Bucket:offload": {"BucketName": bucket},
        "AWS::DynamoDB::Table": {"TableName": f"{NAMESPACE}-messenger-status"},
    }
    # And says what CloudFormation will create anew: the access-log bucket has no fixed name
    assert "FoundationAccessLogs" in err and "no fixed name" in err
    retained = {k for k, r in resources.items() if r.get("DeletionPolicy") == "Retain"}
    assert retained == set(mapping) | {k for k in retained if k in err}


def test_adopt_names_a_bad_template_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.json").write_text("{}")
    assert main(["adopt", str(tmp_path / "missing.json"), "--region", REGION]) == 2
    assert main(["adopt", str(tmp_path / "t.json"), "--region", REGION]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("messenger: template: cannot read")
    assert "not a CloudFormation template" in lines[1]
