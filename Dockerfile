# One image with the three binaries: consumer, publisher, sandbox.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The same stamp as `make release`: docker build --build-arg VERSION=v0.1.0 \
#   --build-arg COMMIT=$(git rev-parse HEAD) --build-arg DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
ARG VERSION=devel COMMIT= DATE=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w \
      -X github.com/toolq/toolq/internal/version.version=${VERSION} \
      -X github.com/toolq/toolq/internal/version.commit=${COMMIT} \
      -X github.com/toolq/toolq/internal/version.date=${DATE}" -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12
ARG VERSION=devel
LABEL org.opencontainers.image.title=toolq org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/ /usr/local/bin/
COPY demo/tools.yaml /etc/toolq/tools.yaml
USER nonroot
ENTRYPOINT ["/usr/local/bin/consumer"]
