# toolq — common tasks. `make help` lists them.
STATICCHECK_VERSION := v0.8.2
GO ?= go

.PHONY: help build release test test-go test-deploy test-mcp-deps test-approvals-deps test-race test-ts test-py lint fuzz soak soak-ha compose-check

# The build's stamp (see internal/version): make release VERSION=v0.1.0
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE    ?= $(shell git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)
LDFLAGS := -s -w -X github.com/toolq/toolq/internal/version.version=$(VERSION) \
	-X github.com/toolq/toolq/internal/version.commit=$(COMMIT) -X github.com/toolq/toolq/internal/version.date=$(DATE)
PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build the binaries into ./bin
	$(GO) build -o bin/ ./cmd/...

release: ## static binaries for linux and darwin, amd64 and arm64, in dist/ with SHA256SUMS (VERSION=v0.1.0)
	rm -rf dist && mkdir -p dist
	set -e; for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; name=toolq_$(VERSION)_$${os}_$${arch}; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o dist/$$name/ ./cmd/...; \
		cp LICENSE README.md CHANGELOG.md dist/$$name/; \
		tar -C dist -czf dist/$$name.tar.gz $$name; rm -r dist/$$name; done
	cd dist && sha256sum *.tar.gz > SHA256SUMS && cat SHA256SUMS

test: test-go soak-ha test-deploy test-ts test-py ## run every test, as CI does: Go with the race detector, the soak on a highly available Postgres, the Kubernetes manifests, then the TypeScript and Python clients

test-go: test-mcp-deps test-approvals-deps ## run the Go tests with the race detector (they start their own NATS and Postgres)
	$(GO) test -race -count=1 ./...

test-deploy: ## render the Kubernetes manifests (deploy/kubernetes, a Go module of its own) and check them
	cd deploy/kubernetes && $(GO) vet ./... && $(GO) test -count=1 ./...

test-mcp-deps: ## install the MCP parts the Go tests run against (test/mcp: the reference server, the TypeScript MCP client)
	@if command -v npm >/dev/null 2>&1; then cd test/mcp && npm ci --no-audit --no-fund --silent; \
	else echo "npm is missing: the MCP tests will skip (they need test/mcp's npm packages)"; fi

test-approvals-deps: ## install what the approvals inbox's browser test drives Chromium with (test/approvals: playwright-core; the browser is Debian's chromium package)
	@if command -v npm >/dev/null 2>&1; then cd test/approvals && npm ci --no-audit --no-fund --silent; \
	else echo "npm is missing: the inbox's browser test will skip (it needs test/approvals's npm packages)"; fi

test-ts: ## build and test the TypeScript client (Node 20, npm)
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test

PYTHON ?= python3
test-py: ## lint, type-check and test the Python client in its own virtual environment (Python 3.10+)
	cd clients/python && { test -x .venv/bin/python || $(PYTHON) -m venv .venv; } && \
		.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' && \
		.venv/bin/ruff check src tests && .venv/bin/ruff format --check src tests && .venv/bin/mypy && .venv/bin/pytest -q

test-race: test-go ## the Go tests with the race detector (test-go)

lint: ## gofmt check, go vet, staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

fuzz: ## fuzz the canonicalizer for a minute
	cd internal/jcs && $(GO) test -run='^$$' -fuzz=FuzzCanonicalize -fuzztime=60s .

soak: ## the full soak: 10,000 jobs, 50 faults of each kind, separate processes (SOAK_SEED=N to change the seed, SOAK_EXECUTOR=mcp to reach the tools over MCP)
	$(GO) test ./test/soak -run TestSoak -count=1 -timeout 60m -v -soak.full -soak.seed=$${SOAK_SEED:-1} -soak.executor=$${SOAK_EXECUTOR:-http}

soak-ha: ## the soak on a pg_auto_failover formation (a monitor, a primary, a synchronous secondary) with postgres_failover faults (needs postgresql-15-auto-failover; SOAK_SEED=N)
	$(GO) test ./test/soak -run TestFailoverSoak -count=1 -timeout 10m -v -soak.ha -soak.seed=$${SOAK_SEED:-1}

compose-check: ## validate docker-compose.yml (needs docker-compose: apt-get install -y docker-compose)
	@if command -v docker-compose >/dev/null 2>&1; then docker-compose -f docker-compose.yml config -q; \
	elif docker compose version >/dev/null 2>&1; then docker compose -f docker-compose.yml config -q; \
	else echo "compose-check needs docker-compose: apt-get install -y docker-compose (Debian), or Docker's compose plugin"; exit 1; fi
	@echo "docker-compose.yml is valid"
