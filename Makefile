# Proxy Pool. `make run` starts the demo appliance; `make test` runs every
# test against real Redis, PostgreSQL and loopback servers from testenv/.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)
LDFLAGS := -s -w -X github.com/proxypool/proxypool/engine/version.Version=$(VERSION)
BIN := bin
CMDS := proxypool

.PHONY: all build run test test-short lint fmt bench fuzz clean deps

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
	@cp go.mod /tmp/proxypool-go.mod.bak; cp go.sum /tmp/proxypool-go.sum.bak; \
	$(GO) mod tidy; \
	if ! git diff --quiet -- go.mod go.sum; then echo "go.mod/go.sum not tidy (run go mod tidy)"; \
	  cp /tmp/proxypool-go.mod.bak go.mod; cp /tmp/proxypool-go.sum.bak go.sum; exit 1; fi

fmt:
	gofmt -w $$(git ls-files '*.go')

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./engine/...

# Short fuzzing pass over every parser.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 20s ./engine/config/

clean:
	rm -rf $(BIN) .run dist
