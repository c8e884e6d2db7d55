# usher: `make run` builds bin/usher and starts the demo, `make test` runs every test.
GO        ?= go
BIN       := bin/usher
PKGS      := ./...
# PostgreSQL tests run against $USHER_TEST_POSTGRES_DSN (.ci/run sets it); without it they are
# skipped outside CI and fail in CI (CI=true).

.PHONY: build run test test-deps lint lint-deps bench bench-engine bench-hop bench-cost bench-limit bench-policies bench-queue bench-slow bench-demo clean

# `usher version` of a make build; a plain `go build` reports Go's build information instead.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/usher

# The demo runs the binary that `make build` leaves, so the README's next steps (bin/usher bench,
# bin/usher sim) find it. Not `go run`: interrupted, it exits 1 although the demo exited 0.
# Ctrl-C reaches the terminal's foreground process group, and GNU make, once its child has
# ended, dies of the signal (status 130). So when make runs in the foreground of a terminal
# (stdin and stderr on it, its process group the terminal's), the demo runs as a job of its own
# (bash -m) that alone gets the terminal and its Ctrl-C: it stops cleanly and make exits 0; if
# that job cannot be brought to the foreground, it is stopped. Anywhere else (a script, a pipe
# on stderr, `make run &`, `timeout -s INT`) make and the demo share the signal as usual.
run: build
	@if [ -t 0 ] && [ -t 2 ] && command -v ps >/dev/null && [ "$$(( $$(ps -o tpgid= -p $$$$) ))" = "$$(( $$(ps -o pgid= -p $$$$) ))" ]; then \
	  bash -mc './$(BIN) demo & fg %1 >/dev/null || { kill %1; wait; exit 1; }'; \
	else ./$(BIN) demo; fi

# go test through test/gotest.sh, which says every 30 s that it still runs.
test: test-deps
	@./test/gotest.sh $(GO) test -race -count=1 -timeout 30m $(PKGS)

# What the tests need beyond Go: redis-server (tests start their own on a free port), Chromium
# (console tests), Node.js with the openai npm package (client compatibility test), llama.cpp's
# llama-server and its models (engine tests; built once into ~/.cache/usher, see
# test/realengine/build.sh).
test-deps:
	@./test/deps.sh

lint: lint-deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)
	$(GO) test -count=1 ./test/deploy/
	./deploy/lint.sh

# What lint needs beyond Go: jq and docker-compose (apt-get when root), promtool (from Debian's
# prometheus package, unpacked into .cache/) and dockerfile-utils (npm, into .cache/);
# kubeconform, kustomize and the Kubernetes schemas come through the Go module proxy. See
# deploy/lint.sh.
lint-deps:
	@./deploy/lint.sh deps

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# The gateway hop against nginx on loopback (installs nginx and wrk when root); see the script.
bench-hop:
	./test/hopbench/run.sh

# The cost model's TTFT and TPOT predictions against the engines' own times, on simulated
# workers in slots and kv mode and on real llama-servers when built (about 8 minutes; see the
# script for its knobs).
bench-cost:
	./test/costbench/run.sh

# The learned concurrency limit against fixed ones on two vLLM-like simulated workers under a
# heavy standard load (about 3 minutes; see the script for its knobs).
bench-limit:
	./test/limitbench/run.sh

# Routing policies side by side on four simulated workers, shared-prefix and Mooncake (about 12
# minutes; POLICIES, WORKLOADS and the scales are environment variables, see the script).
bench-policies:
	./test/policybench/run.sh

# The queueing scenarios (protection, fairness, deadlines) with usher bench against the
# gateway and two simulated workers on loopback, about 6 minutes; see the script for its knobs.
bench-queue:
	./test/queuebench/run.sh

# The protection table: interactive TTFT beside a batch flood on three real llama-server
# workers (default config, queue.fifo, max_concurrency by hand, prefill-heavy batch); about 15
# minutes after the engine is built; see the script for its knobs.
bench-engine:
	./test/enginebench/run.sh

# The demo against its own banner's bench line: interactive alone, beside the batch tenant twice,
# then again after IDLE (10 minutes by default) of nothing, with the learned limits' moves (about
# 13 minutes; see the script).
bench-demo:
	./test/demobench/run.sh

# The slow-body attack: 20,000 trickling connections from 100 loopback addresses beside
# real requests, whose p99 it prints (about a minute); see the script for its knobs.
bench-slow:
	./test/slowbench/run.sh

clean:
	rm -rf bin artifacts
