#!/usr/bin/env bash
# Builds the real inference engine the end-to-end tests run usher in front of: llama.cpp's
# llama-server (CPU only) and two llama-architecture GGUF models with random weights and the real
# Qwen2 tokenizer. Nothing ships trained weights through the registries this project may reach,
# so the weights are random (the text is gibberish); the tokenizer, KV cache, prompt cache, slot
# scheduler and HTTP/SSE server are llama.cpp's own.
#
# Source: the npm package node-llama-cpp carries the llama.cpp source as a git bundle
# (package/llama/gitRelease.bundle); `npm pack` fetches it without installing anything.
# Licences: llama.cpp and ggml are MIT ("The ggml authors"), node-llama-cpp is MIT; the
# tokenizer tables come from llama.cpp's MIT-licensed models/ggml-vocab-qwen2.gguf (derived from
# the Apache-2.0 Qwen2 tokenizer). The weights are random numbers written by ./mkmodel.
#
# Everything is cached outside the repository, in $USHER_REALENGINE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/usher/realengine-$NLC_VERSION):
#   bin/llama-server      the engine (GGML_NATIVE=OFF: runs on any x86-64 with AVX2)
#   models/micro.gguf     e64, 2 layers, 45 MB: fast tests
#   models/small.gguf     e512, 8 layers, 370 MB: prefill and cache cost visible
# Safe to re-run: a second run finds both and returns at once; concurrent runs (several
# worktrees) take a lock. The first run takes about 10 to 12 minutes on 2 cores; every download
# and build step is bounded by timeout, and says on stderr when it starts and ends, and every 30 s
# while it runs (test/progress.sh). Prints the cache directory on stdout when done.
#
#   test/realengine/build.sh          # build what is missing
#   test/realengine/build.sh --dir    # print the cache directory only
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

NLC_VERSION=3.22.1   # node-llama-cpp; its bundle is llama.cpp commit de3ff81
DIR="${USHER_REALENGINE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/usher/realengine-$NLC_VERSION}"
if [ "${1:-}" = --dir ]; then echo "$DIR"; exit 0; fi

ready() { [ -x "$DIR/bin/llama-server" ] && [ -f "$DIR/models/micro.gguf" ] && [ -f "$DIR/models/small.gguf" ]; }
if ready; then echo "$DIR"; exit 0; fi

PROGRESS_PREFIX=realengine
# shellcheck source=../progress.sh
. "$HERE/../progress.sh"
log() { say "$*"; }
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
if ! flock -n 9; then
  step "waiting for another build of $DIR (its lock)" flock -w 1800 9 ||
    { log "another build holds $DIR/.lock for 30 minutes; giving up"; exit 1; }
fi
if ready; then echo "$DIR"; exit 0; fi
log "building llama.cpp's llama-server and two test models into $DIR, once (about 10 to 12 minutes on 2 cores)"

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v git >/dev/null 2>&1 || need+=(git)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v go >/dev/null 2>&1 || { log "needs Go on PATH"; exit 1; }
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "apt-get update" timeout 300 apt-get update -qq >/dev/null
    step "installing ${need[*]} with apt-get" \
      env DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${need[@]}" >/dev/null
  else
    log "building llama-server needs: sudo apt-get install -y ${need[*]}"
    exit 1
  fi
fi

src="$DIR/llama.cpp"
if [ ! -x "$DIR/bin/llama-server" ] || [ ! -f "$DIR/vocab/ggml-vocab-qwen2.gguf" ]; then
  work=$(mktemp -d "$DIR/work.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  tgz="$DIR/node-llama-cpp-$NLC_VERSION.tgz"
  if [ ! -f "$tgz" ]; then
    (cd "$work" && step "fetching node-llama-cpp@$NLC_VERSION from npm (36 MB): llama.cpp's source" \
      timeout 300 npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null)
    mv "$work/node-llama-cpp-$NLC_VERSION.tgz" "$tgz"
  fi
  step "unpacking llama.cpp's source" timeout 120 tar -xzf "$tgz" -C "$work" package/llama/gitRelease.bundle
  rm -rf "$src"
  step "checking out llama.cpp" \
    timeout 300 git -c advice.detachedHead=false clone -q "$work/package/llama/gitRelease.bundle" "$src"
  mkdir -p "$DIR/vocab"
  cp "$src/models/ggml-vocab-qwen2.gguf" "$src/LICENSE" "$DIR/vocab/"
  if [ ! -x "$DIR/bin/llama-server" ]; then
    # No tests, examples, TLS or web UI (USE_PREBUILT_UI would download one); GGML_NATIVE=OFF so the
    # cached binary does not depend on this machine's CPU.
    step "configuring llama-server (cmake)" \
      timeout 120 cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log" 2>&1 ||
      { cat "$work/cmake.log" >&2; exit 1; }
    step "building llama-server (the long step: about 10 minutes on 2 cores)" \
      timeout 2400 cmake --build "$src/build" --config Release --target llama-server -j"$(nproc)" >"$work/build.log" 2>&1 ||
      { tail -50 "$work/build.log" >&2; exit 1; }
    mkdir -p "$DIR/bin"
    cp "$src/build/bin/llama-server" "$DIR/bin/llama-server.tmp"
    mv "$DIR/bin/llama-server.tmp" "$DIR/bin/llama-server"
  fi
  rm -rf "$src"
fi

mkdir -p "$DIR/models"
mkmodel() { # NAME ARGS...: writes models/NAME.gguf unless it is there
  local name=$1; shift
  [ -f "$DIR/models/$name.gguf" ] && return
  (cd "$HERE" && step "writing models/$name.gguf" timeout 600 go run ./mkmodel --vocab "$DIR/vocab/ggml-vocab-qwen2.gguf" \
    --out "$DIR/models/$name.gguf.tmp" --name "$name" "$@")
  mv "$DIR/models/$name.gguf.tmp" "$DIR/models/$name.gguf"
}
mkmodel micro --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --ctx 4096 --untied
mkmodel small --n-embd 512 --n-layer 8 --n-head 8 --n-head-kv 8 --n-ff 1536 --ctx 8192 --untied
ready
log "llama-server and its models are ready in $DIR"
echo "$DIR"
