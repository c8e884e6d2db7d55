#!/bin/sh
# Checks everything under deploy/ with the tools that read those files (run by `make lint`):
#   docker-compose    compose.yaml against the Compose schema (`config -q`; no engine needed)
#   dockerfile-utils  Dockerfile (the parser and linter of the Dockerfile language server)
#   promtool          prometheus.yml (config), alerts.yaml (rules and their unit tests), and
#                     every Grafana dashboard query (grafana/check.sh)
#   kubeconform       the Kustomize base and the examples against the Kubernetes schemas
#                     (kubernetes/check.sh, offline through the Go module proxy)
# `deploy/lint.sh deps` fetches what is missing (run by `make lint-deps`): jq and docker-compose
# with apt-get when root; promtool, unpacked from Debian's prometheus package into .cache/ (no
# daemon is installed or started); dockerfile-utils from npm into .cache/. What is already on
# PATH is left alone.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
PATH=$root/.cache/promtool/usr/bin:$root/.cache/npm/node_modules/.bin:$PATH
export PATH

if [ "${1:-}" = deps ]; then
	missing=
	command -v jq >/dev/null 2>&1 || missing="$missing jq"
	command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
	if [ -n "$missing" ]; then
		if [ "$(id -u)" = 0 ]; then
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
		else
			echo "deploy/lint.sh: missing:$missing; run: sudo apt-get install$missing" >&2
			exit 1
		fi
	fi
	if ! command -v dockerfile-utils >/dev/null 2>&1; then
		npm install --silent --no-audit --no-fund --prefix "$root/.cache/npm" dockerfile-utils@0.16.3 >/dev/null
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
docker-compose -f compose.yaml config -q && echo "compose.yaml: valid"
dockerfile-utils lint Dockerfile && echo "Dockerfile: no problems"
promtool check config prometheus/prometheus.yml
promtool test rules prometheus/alerts_test.yaml
grafana/check.sh
kubernetes/check.sh
