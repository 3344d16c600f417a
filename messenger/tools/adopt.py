"""`messenger adopt`: the resource mapping that lets `cdk import` take back retained resources.

Deleting a platform or channel stack keeps its retained resources (key, alias, offload bucket,
status table, queues, topics) with their data, and their fixed names make the next deploy of
that stack fail ("already exists"). A channel stack's are all named in its template:
`npx cdk deploy <stack> --import-existing-resources` adopts them in one deploy. The platform's
key has no name CloudFormation can match, so:

    npx cdk synth <stack>
    messenger adopt cdk.out/<stack>.template.json > resources.json
    npx cdk import <stack> --resource-mapping resources.json
    npx cdk deploy <stack>

This command reads the synthesized template and, for each retained resource, looks up the one
that exists in the account and region by its name, and the key as the one that encrypts the
adopted bucket or table (the alias goes with the stack). What does not exist is left out
(CloudFormation creates it); what has no name (the access-log bucket) is reported on stderr and
created anew.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.tools.runtime import CommandRuntime

#: The import identifier and the naming property of each retained resource type.
IDENTIFIERS = {
    "AWS::KMS::Alias": ("AliasName", "AliasName"),
    "AWS::S3::Bucket": ("BucketName", "BucketName"),
    "AWS::DynamoDB::Table": ("TableName", "TableName"),
    "AWS::SQS::Queue": ("QueueUrl", "QueueName"),
    "AWS::SNS::Topic": ("TopicArn", "TopicName"),
}
_MISSING = {"NotFoundException", "NoSuchBucket", "404", "ResourceNotFoundException",
            "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NotFound"}


def _resolve(value: Any, pseudo: dict[str, str]) -> str | None:
    """A name built from literals and pseudo parameters (Fn::Join, Ref AWS::*); else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return pseudo.get(value["Ref"])
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        resolved = [_resolve(part, pseudo) for part in parts]
        return None if None in resolved else separator.join(str(p) for p in resolved)
    return None


def _missing(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") in _MISSING


def resource_mapping(
    template: dict[str, Any], clients: ClientFactory, account: str, partition: str = "aws",
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """(logical id -> import identifier of the existing resource, notes on what is left out)."""
    resources = template.get("Resources")
    if not isinstance(resources, dict):
        raise InvalidSettings("the file is not a CloudFormation template (no Resources)")
    pseudo = {"AWS::AccountId": account, "AWS::Region": clients.region,
              "AWS::Partition": partition}
    mapping: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    retained = {k: r for k, r in resources.items() if r.get("DeletionPolicy") == "Retain"}
    for logical_id, resource in retained.items():
        kind, properties = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::KMS::Key":
            continue  # through its alias, below
        if kind not in IDENTIFIERS:
            notes.append(f"{logical_id}: {kind} is not adopted by this command")
            continue
        identifier, naming = IDENTIFIERS[kind]
        name = _resolve(properties.get(naming), pseudo)
        if name is None:
            notes.append(f"{logical_id}: no fixed name; CloudFormation creates a new one "
                         f"(the retained one stays, unused)")
            continue
        try:
            value = _existing(clients, kind, name, account, partition)
        except ClientError as error:
            if not _missing(error):
                raise
            notes.append(f"{logical_id}: {name} does not exist; CloudFormation creates it")
            continue
        mapping[logical_id] = {identifier: value}
    for key_id in [k for k, r in retained.items() if r["Type"] == "AWS::KMS::Key"]:
        # The key that encrypts the adopted data: read from a resource the template encrypts
        # with it (the alias is deleted with the stack; the data's own setting remains).
        users = [k for k in mapping if key_id in json.dumps(resources[k].get("Properties", {}))]
        for user in users:
            arn = _key_used_by(clients, resources[user]["Type"], mapping[user])
            if arn:
                key = clients.client("kms").describe_key(KeyId=arn)["KeyMetadata"]["KeyId"]
                mapping[key_id] = {"KeyId": key}
                break
        else:
            notes.append(f"{key_id}: no adopted resource names its key; CloudFormation creates "
                         f"a new key")
    return mapping, notes


def _key_used_by(clients: ClientFactory, kind: str, identifier: dict[str, str]) -> str | None:
    """The KMS key (id or ARN) an existing resource is encrypted with, if any."""
    (value,) = identifier.values()
    if kind == "AWS::S3::Bucket":
        rules = clients.client("s3").get_bucket_encryption(Bucket=value)[
            "ServerSideEncryptionConfiguration"]["Rules"]
        return next((r["ApplyServerSideEncryptionByDefault"].get("KMSMasterKeyID")
                     for r in rules if "ApplyServerSideEncryptionByDefault" in r), None)
    if kind == "AWS::DynamoDB::Table":
        table = clients.client("dynamodb").describe_table(TableName=value)["Table"]
        return table.get("SSEDescription", {}).get("KMSMasterKeyArn")
    if kind == "AWS::KMS::Alias":
        return value
    if kind == "AWS::SQS::Queue":
        attributes = clients.client("sqs").get_queue_attributes(
            QueueUrl=value, AttributeNames=["KmsMasterKeyId"])["Attributes"]
        return attributes.get("KmsMasterKeyId")
    return clients.client("sns").get_topic_attributes(TopicArn=value)["Attributes"].get(
        "KmsMasterKeyId")


def _existing(clients: ClientFactory, kind: str, name: str, account: str, partition: str) -> str:
    """The import identifier of the resource named `name`; ClientError when it is missing."""
    if kind == "AWS::KMS::Alias":
        clients.client("kms").describe_key(KeyId=name)
        return name
    if kind == "AWS::S3::Bucket":
        clients.client("s3").head_bucket(Bucket=name)
        return name
    if kind == "AWS::DynamoDB::Table":
        clients.client("dynamodb").describe_table(TableName=name)
        return name
    if kind == "AWS::SQS::Queue":
        return str(clients.client("sqs").get_queue_url(QueueName=name)["QueueUrl"])
    arn = f"arn:{partition}:sns:{clients.region}:{account}:{name}"
    clients.client("sns").get_topic_attributes(TopicArn=arn)
    return arn


def run_cli(args: argparse.Namespace) -> int:
    path = Path(args.template)
    try:
        template = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InvalidSettings(f"template: cannot read {path} as JSON ({error})") from None
    if not isinstance(template, dict) or not isinstance(template.get("Resources"), dict):
        raise InvalidSettings(f"template: {path} is not a CloudFormation template (no Resources)")
    region = args.region
    if not region:
        import boto3

        region = boto3.session.Session().region_name
        if not region:
            raise InvalidSettings("--region: no region given and none configured")
    clients = CommandRuntime.from_env(region=region).clients
    account = clients.client("sts").get_caller_identity()["Account"]
    mapping, notes = resource_mapping(template, clients, account)
    for note in notes:
        print(f"messenger adopt: {note}", file=sys.stderr)
    print(json.dumps(mapping, indent=2, sort_keys=True))
    return 0


def add_parser(commands: Any) -> None:
    adopt = commands.add_parser(
        "adopt", help="resource mapping for `cdk import` of a deleted stack's retained resources"
    )
    adopt.add_argument("template", help="the synthesized template (cdk.out/<stack>.template.json)")
    adopt.add_argument("--region", help="the stack's region (default: the configured one)")
    adopt.set_defaults(run=run_cli)
