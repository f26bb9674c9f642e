# Proxy Pool. `make run` starts the demo appliance; `make test` runs every
# test against real Redis, PostgreSQL and loopback servers from testenv/.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)
LDFLAGS := -s -w -X github.com/proxypool/proxypool/engine/version.Version=$(VERSION)
BIN := bin
CMDS := proxypool proxy-controller

.PHONY: all build run test test-short lint fmt bench fuzz clean deps plugins

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

# The demo: simulated vendor, five upstream proxies and a target, all on
# loopback, started in-process by the demo section of demo.yaml.
run: build
	@mkdir -p .run/state
	$(BIN)/proxypool run --config etc/proxypool/demo.yaml

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

test-short:
	$(GO) test -count=1 -short ./...

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@tmp=$$(mktemp -d); cp go.mod go.sum $$tmp/; $(GO) mod tidy; \
	if ! cmp -s go.mod $$tmp/go.mod || ! cmp -s go.sum $$tmp/go.sum; then \
	  echo "go.mod/go.sum not tidy (run go mod tidy)"; cp $$tmp/go.mod $$tmp/go.sum .; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp

fmt:
	gofmt -w $$(git ls-files '*.go')

# Go benchmarks of the engine, then the full scenario suite of seed 000
# §17.3 (bench/suite, docs/benchmarks.md): about half an hour on 2 cores,
# most of it growing the pool to 100,000 proxies.
bench: bench-tools bench-pprof
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./engine/...
	$(BIN)/benchrun -suite full -pprof-proxypool $(BIN)/proxypool-pprof

# Short fuzzing pass over every parser: each Fuzz* target in the tree for
# FUZZTIME (go test fuzzes one target per run).
FUZZTIME ?= 10s
fuzz:
	@grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$f"); do \
	    echo "fuzz $$t ($$(dirname $$f))"; \
	    $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) "./$$(dirname $$f)/" || exit 1; \
	  done; \
	done

# WASM provider plugins: plugins/src/NAME/ -> plugins/NAME.wasm
plugins:
	./plugins/build.sh

clean:
	rm -rf $(BIN) .run dist
	rm -f plugins/*.wasm

# Linux packages (SPEC §10): dist/proxypool_<version>_<arch>.deb and
# dist/proxypool-<version>-1.<arch>.rpm for each PKG_ARCHES, built with the
# nfpm library from packaging/nfpm.yaml (packaging/cmd/mkpkg), plus
# dist/manifest.json listing them. docs/operations.md covers installing them.
PKG_ARCHES ?= amd64 arm64

.PHONY: package package-test

package: plugins
	@set -e; for arch in $(PKG_ARCHES); do \
	  echo "build linux/$$arch"; mkdir -p $(BIN)/linux_$$arch; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
	    -o $(BIN)/linux_$$arch/ ./cmd/proxypool; \
	done
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
	  $(GO) run ./packaging/cmd/mkpkg -version '$(VERSION)' -arch '$(PKG_ARCHES)' \
	  -bindir $(BIN) -out dist -optional 'plugins/*.wasm'

# Builds the packages, then inspects them (dpkg-deb, rpm), verifies the
# units, socket-activates and reloads the binary, and installs, upgrades,
# removes and purges the .deb on this machine: root on Debian. Installs the
# tools it needs (rpm, systemd's analyzer and socket activator) when missing.
# No -race: the tests mostly drive other processes, and the race detector
# makes the in-test package build (nfpm's compression) 40 times slower;
# `make test` runs packaging's fast tests with -race.
package-test: package
	@need=(); \
	command -v rpm >/dev/null || need+=(rpm); \
	command -v systemd-analyze >/dev/null || need+=(systemd); \
	command -v systemd-socket-activate >/dev/null || need+=(systemd); \
	if [ $${#need[@]} -gt 0 ]; then \
	  echo "installing: $${need[*]}"; apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $${need[*]}; \
	fi
	PROXYPOOL_PACKAGE_TEST=1 $(GO) test -count=1 -v -timeout 10m ./packaging/...

# Benchmarks (seed 000 §17; method and results in docs/benchmarks.md).
# bench-tools builds the load generator, the simulations (run in their own
# process) and the runner; bench-pprof builds bin/proxypool-pprof, the
# appliance with net/http/pprof on a loopback address, overlaid from
# bench/pprof and used only to take profiles. Every process the suite
# starts is stopped by its PID; reports, logs and profiles go to
# .run/bench/.
BENCH_TOOLS := ./cmd/proxy-loadgen ./bench/cmd/simupstreams ./bench/cmd/benchrun

.PHONY: bench-tools bench-pprof bench-quick bench-peers

bench-tools: build
	$(GO) build -trimpath -o $(BIN)/ $(BENCH_TOOLS)

bench-pprof:
	@mkdir -p $(BIN)
	@printf '{"Replace":{"%s":"%s"}}\n' "$(CURDIR)/cmd/proxypool/zz_bench_pprof.go" \
	  "$(CURDIR)/bench/pprof/pprof.go.txt" > $(BIN)/pprof-overlay.json
	$(GO) build -overlay $(BIN)/pprof-overlay.json -ldflags '-X github.com/proxypool/proxypool/engine/version.Version=$(VERSION)' \
	  -o $(BIN)/proxypool-pprof ./cmd/proxypool

# The CI subset: every scenario, smaller and shorter (about 40 s here).
bench-quick: bench-tools
	$(BIN)/benchrun -suite quick

# Squid and tinyproxy side by side with the gateway (installs them from
# Debian packages when missing): about ten minutes.
bench-peers: bench-tools
	bash bench/peers/install.sh
	$(BIN)/benchrun -suite peers
