#!/usr/bin/env bash
# aws-cli against packrat. Usage: PACKRAT_ENDPOINT=http://127.0.0.1:9000 \
#   AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... sdk-examples/awscli.sh DIR
set -euo pipefail
ep=${PACKRAT_ENDPOINT:-http://127.0.0.1:9000}
dir=${1:?usage: awscli.sh DIR-TO-UPLOAD}
bucket=${PACKRAT_EXAMPLE_BUCKET:-cli-example}
aws --endpoint-url "$ep" s3 mb "s3://$bucket" 2>/dev/null || true
aws --endpoint-url "$ep" s3 sync "$dir" "s3://$bucket/data/" --only-show-errors
aws --endpoint-url "$ep" s3 ls --recursive --summarize "s3://$bucket/data/" | tail -2
first=$(aws --endpoint-url "$ep" s3api list-objects-v2 --bucket "$bucket" --prefix data/ --max-keys 1 --no-paginate --query 'Contents[0].Key' --output text)
aws --endpoint-url "$ep" s3api head-object --bucket "$bucket" --key "$first"
