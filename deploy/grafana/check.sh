#!/bin/sh
# Checks that every query of the Grafana dashboard is valid PromQL: the panels' expressions,
# with Grafana's variables given sample values, become recording rules that promtool parses.
# Needs jq and promtool. Usage: deploy/grafana/check.sh [dashboard.json]
set -eu

dashboard=${1:-$(dirname "$0")/usher-dashboard.json}
rules=$(mktemp)
trap 'rm -f "$rules"' EXIT

jq -e '[.panels[] | select(.type != "row") | .targets[]?.expr] | length > 0' "$dashboard" >/dev/null
jq -r '"groups:\n  - name: dashboard\n    rules:",
	(.panels[] | select(.type != "row") | .id as $id | .targets[]
		| "      - record: panel_\($id)_\(.refId)\n        expr: \(.expr
			| gsub("\\$__rate_interval"; "1m") | gsub("\\$__range"; "1h") | gsub("\\$model"; ".*")
			| tojson)")' "$dashboard" > "$rules"
if grep -n '\$' "$rules"; then
	echo "grafana/check.sh: a Grafana variable above has no sample value" >&2
	exit 1
fi
promtool check rules "$rules"
