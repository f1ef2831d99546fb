#!/usr/bin/env bash
# Prometheus rules (deploy/prometheus/): promtool's syntax check and unit tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
promtool check rules deploy/prometheus/tandem-rules.yaml
promtool test rules tests/deploy/prometheus/tandem_rules_test.yaml
echo PASS
