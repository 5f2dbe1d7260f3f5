# toolq — common tasks. `make help` lists them.
STATICCHECK_VERSION := v0.8.2
GO ?= go

.PHONY: help build test test-go test-race test-ts lint fuzz soak compose-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build the binaries into ./bin
	$(GO) build -o bin/ ./cmd/...

test: test-go test-ts ## run every test, as CI does: Go with the race detector, then the TypeScript client

test-go: ## run the Go tests with the race detector (they start their own NATS and Postgres)
	$(GO) test -race -count=1 ./...

test-ts: ## build and test the TypeScript client (Node 20, npm)
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test

test-race: test-go ## the Go tests with the race detector (test-go)

lint: ## gofmt check, go vet, staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fuzz: ## fuzz the canonicalizer for a minute
	cd internal/jcs && $(GO) test -run='^$$' -fuzz=FuzzCanonicalize -fuzztime=60s .

soak: ## the full soak: 10,000 jobs, 50 faults of each kind, separate processes (SOAK_SEED=N to change the seed)
	$(GO) test ./test/soak -run TestSoak -count=1 -timeout 60m -v -soak.full -soak.seed=$${SOAK_SEED:-1}

compose-check: ## validate docker-compose.yml (needs docker-compose: apt-get install -y docker-compose)
	@if command -v docker-compose >/dev/null 2>&1; then docker-compose -f docker-compose.yml config -q; \
	elif docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config -q; \
	else echo "compose-check needs docker-compose: apt-get install -y docker-compose (Debian), or Docker's compose plugin"; exit 1; fi
	@echo "docker-compose.yml is valid"
