#!/usr/bin/env python3
"""`mc mb -p s3/BUCKET` of the stand-in: create the bucket unless it exists (tests only)."""

import sys

import boto3

s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
if sys.argv[2] not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
    s3.create_bucket(Bucket=sys.argv[2])
print(f"bucket {sys.argv[2]} at {sys.argv[1]}")
