# syntax=docker/dockerfile:1
#
# One image with every lock.dev binary; the command picks the process:
#
#   docker build --build-arg VERSION=1.4.0 -t lockdev:1.4.0 .
#   docker run --rm lockdev:1.4.0 rail-proxy --version
#   docker run --rm -e PAYDB_URL=... lockdev:1.4.0 rail-proxy migrate
#
# Binaries are static (CGO_ENABLED=0) and run as distroless's nonroot user
# (65532) on a base with no shell and no package manager. Compose health checks
# use the healthcheck binary (GET a URL, exit 0 on 200) on each service's
# plaintext HEALTH_ADDR port; Kubernetes probes the same paths itself. The API
# ports speak mutual TLS (docs/contracts/workload-identity.md).

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
ENV GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -X lock.dev/internal/version.version=${VERSION}" \
      -o /out/ \
      ./cmd/lock-server ./cmd/payment-resource ./cmd/rail-proxy ./cmd/rail-stub \
      ./cmd/executor ./cmd/reconciler ./cmd/healthcheck
# rail-stub's call-log directory, owned by the runtime user, so that a volume
# mounted there starts writable (the root filesystem is read-only).
RUN mkdir -p /rootfs/var/lib/rail-stub

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="lock.dev" \
      org.opencontainers.image.description="Fencing tokens where money moves: lock-server, payment-resource, rail-proxy, rail-stub, executor, reconciler" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /rootfs/ /
USER 65532:65532
# lock-server, payment-resource, rail-proxy, rail-stub, executor, reconciler (docs/contracts/configuration.md),
# then their HEALTH_ADDR ports as deploy/ sets them.
EXPOSE 8081 8082 8083 8084 8085 8086 9081 9082 9083 9084 9085 9086
# No ENTRYPOINT: the command names the binary (PATH holds /usr/local/bin).
CMD ["lock-server", "--help"]
