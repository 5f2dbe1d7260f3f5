# toolq — common tasks. `make help` lists them.
STATICCHECK_VERSION := v0.8.2
GO ?= go

.PHONY: help build test test-go test-race test-ts lint fuzz

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build the binaries into ./bin
	$(GO) build -o bin/ ./cmd/...

test: test-go test-ts ## run every test: Go, then the TypeScript client

test-go: ## run the Go tests (they start their own NATS and Postgres)
	$(GO) test ./...

test-ts: ## build and test the TypeScript client (Node 20, npm)
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test

test-race: ## run every test with the race detector, as CI does
	$(GO) test -race ./...

lint: ## gofmt check, go vet, staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fuzz: ## fuzz the canonicalizer for a minute
	cd internal/jcs && $(GO) test -run='^$$' -fuzz=FuzzCanonicalize -fuzztime=60s .
