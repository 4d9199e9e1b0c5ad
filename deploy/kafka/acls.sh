#!/bin/sh
# The Kafka ACLs of a batchstream deployment: each service writes what it owns and reads what it
# needs; a pipeline writes requests and reads its own reply topics. Run once against a broker whose
# authorizer denies what no ACL allows (allow.everyone.if.no.acl.found=false), as the super user
# (KAFKA_ADMIN_PASSWORD); adding an ACL that exists is a no-op, so a re-run is safe.
# docker-compose.yml runs it as the `kafka-acls` service; docs/deployment.md ("Kafka access") explains
# each rule and how to add a pipeline.
#
#   BOOTSTRAP=kafka:9092 KAFKA_ADMIN_PASSWORD=... PIPELINES="etl search" sh deploy/kafka/acls.sh
set -eu

: "${BOOTSTRAP:=kafka:9092}"
: "${TOPIC_PREFIX:=}"                        # BATCHSTREAM_KAFKA_TOPIC_PREFIX
: "${AGGREGATOR_APP_ID:=batchstream-aggregator}"
: "${PIPELINES:=pipeline}"                   # one Kafka user per pipeline; replies under "<user>."
: "${KAFKA_BIN:=/opt/kafka/bin}"
P="$TOPIC_PREFIX"

config=$(mktemp)
trap 'rm -f "$config"' EXIT
cat > "$config" <<CONFIG
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
CONFIG

acl() {  # acl USER ARGS...: allow USER the operations and resources in ARGS
  user=$1; shift
  "$KAFKA_BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --command-config "$config" \
    --add --allow-principal "User:$user" "$@" > /dev/null
}

# api: creates the topics, sends request lines and control facts (cancels), writes the results of
# lines it answers itself (line_lost, unserved models), and reads the workers' committed offsets
# (its dispatcher meters each model's topic by them).
acl api --operation Create --operation Write --operation Describe \
  --resource-pattern-type prefixed --topic "${P}requests."
acl api --operation Create --operation Write --operation Describe --topic "${P}control" --topic "${P}results"
acl api --operation Create --operation Describe --topic "${P}dead-letters"
acl api --operation Describe --resource-pattern-type prefixed --group "${P}batchstream-inference-"

# inference: reads its model's requests in its group and the control topic; writes results,
# dead letters and replies to pipelines' topics (which the workers check before sending).
acl inference --operation Read --operation Describe --operation Create \
  --resource-pattern-type prefixed --topic "${P}requests."
acl inference --operation Read --resource-pattern-type prefixed --group "${P}batchstream-inference-"
acl inference --operation Read --operation Describe --topic "${P}control"
acl inference --operation Write --operation Describe --operation Create \
  --topic "${P}results" --topic "${P}dead-letters"

# aggregator: reads results in its group; owns its faust topics (changelog, leader).
acl aggregator --operation Read --operation Describe --topic "${P}results"
acl aggregator --operation All --resource-pattern-type prefixed --topic "${P}${AGGREGATOR_APP_ID}"
acl aggregator --operation All --resource-pattern-type prefixed --group "${P}${AGGREGATOR_APP_ID}"

# kafka-exporter: describes every topic and group (consumer lag), reads nothing.
acl exporter --operation Describe --topic '*' --group '*'
acl exporter --operation DescribeConfigs --topic '*'

# Pipelines: write request messages to any model's topic; read, create and consume only their
# own reply topics and groups, "<user>.<anything>". A request naming a batch must carry the
# dispatcher's signature (docs/kafka-protocol.md), so writing requests forges nothing.
for user in $PIPELINES; do
  acl "$user" --operation Write --operation Describe --resource-pattern-type prefixed --topic "${P}requests."
  acl "$user" --operation Read --operation Describe --operation Create \
    --resource-pattern-type prefixed --topic "${P}${user}."
  acl "$user" --operation Read --resource-pattern-type prefixed --group "${P}${user}."
  acl inference --operation Write --operation Describe --resource-pattern-type prefixed --topic "${P}${user}."
done
echo "ACLs in place for api, inference, aggregator, exporter and pipelines: $PIPELINES"
