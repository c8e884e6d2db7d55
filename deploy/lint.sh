#!/bin/sh
# Checks everything under deploy/ with the tools that read those files (run by `make lint`):
#   promtool     prometheus.yml (config), alerts.yaml (rules and their unit tests), and every
#                Grafana dashboard query (grafana/check.sh)
#   kubeconform  the Kustomize base and the examples against the Kubernetes schemas
#                (kubernetes/check.sh, offline through the Go module proxy)
# `deploy/lint.sh deps` fetches what is missing (run by `make lint-deps`): jq with apt-get when
# root, and promtool, unpacked from Debian's prometheus package into .cache/ (no daemon is
# installed or started). Both leave alone what is already on PATH.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
PATH=$root/.cache/promtool/usr/bin:$PATH
export PATH

if [ "${1:-}" = deps ]; then
	if ! command -v jq >/dev/null 2>&1; then
		if [ "$(id -u)" = 0 ]; then
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends jq
		else
			echo "deploy/lint.sh: jq is missing; run: sudo apt-get install jq" >&2
			exit 1
		fi
	fi
	if ! command -v promtool >/dev/null 2>&1; then
		tmp=$(mktemp -d)
		trap 'rm -rf "$tmp"' EXIT
		chmod 755 "$tmp"
		(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || {
			[ "$(id -u)" = 0 ] && apt-get update -qq && (cd "$tmp" && apt-get download prometheus >/dev/null)
		} || { echo "deploy/lint.sh: cannot fetch Debian's prometheus package for promtool" >&2; exit 1; }
		rm -rf "$root/.cache/promtool"
		mkdir -p "$root/.cache"
		dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/pkg"
		mkdir -p "$root/.cache/promtool/usr/bin"
		mv "$tmp/pkg/usr/bin/promtool" "$root/.cache/promtool/usr/bin/promtool"
	fi
	exit 0
fi

cd "$root/deploy"
promtool check config prometheus/prometheus.yml
promtool test rules prometheus/alerts_test.yaml
grafana/check.sh
kubernetes/check.sh
