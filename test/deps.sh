#!/usr/bin/env bash
# Installs what the tests need beyond Go when it can (root with apt-get, npm), or names it. Each
# step says when it starts and ends, with the time since the setup began, and every 30 s while it
# runs (test/progress.sh): the first run builds llama.cpp, about 10 to 12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PROGRESS_PREFIX=test-deps
# shellcheck source=progress.sh
. test/progress.sh

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "apt-get update" apt-get update -qq >/dev/null
    step "installing ${missing[*]} with apt-get" \
      env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "test-deps: the tests need: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# The official openai npm client, for the client compatibility test.
if [ ! -d test/openai-js/node_modules/openai ]; then
  (cd test/openai-js && step "installing the openai npm package into test/openai-js" npm ci --silent --no-audit --no-fund)
fi

# llama.cpp's llama-server and its random-weight models, for the end-to-end tests against a real
# engine; built once into a cache outside the repository (~/.cache/usher), then found at once.
./test/realengine/build.sh >/dev/null
