#!/usr/bin/env bash
# Kafka's kafka-broker-api-versions.sh: the API versions each broker answers (the health check).
set -euo pipefail
exec java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
  -cp '/opt/kafka/libs/*' org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
