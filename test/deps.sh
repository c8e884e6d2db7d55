#!/usr/bin/env bash
# Installs what the tests need beyond Go when it can (root with apt-get, npm), or names it.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-deps: installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "test-deps: the tests need: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# The official openai npm client, for the client compatibility test.
if [ ! -d test/openai-js/node_modules/openai ]; then
  (cd test/openai-js && npm ci --silent --no-audit --no-fund)
fi

# llama.cpp's llama-server and its random-weight models, for the end-to-end tests against a real
# engine; built once into a cache outside the repository (about 6 minutes), then found at once.
./test/realengine/build.sh >/dev/null
