# One image with the three binaries: consumer, publisher, sandbox.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/ /usr/local/bin/
COPY demo/tools.yaml /etc/toolq/tools.yaml
USER nonroot
ENTRYPOINT ["/usr/local/bin/consumer"]
