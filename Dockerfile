# One image with the service's binaries; docker-compose.yml and the
# Kubernetes manifests (deploy/k8s) pick the process with `command`.
# Build: docker build -t checkout .  (target all: api, dispatcher, worker, migrate)
# With the Stripe emulator, for compose and the dev overlay:
#   docker build --target dev -t checkout-emulator .
# A single binary: docker build --build-arg BIN=worker --target single -t checkout-worker .
# Needs BuildKit (the default builder since Docker Engine 23) for the cache mounts.
# .dockerignore lets in only what the build reads: go.mod, go.sum, cmd/,
# internal/ and migrations/ (embedded), without tests.

# The tag names a patch release at or above go.mod's `go` line
# (internal/deploy checks it): a bare 1.26 could be an older cached image.
FROM golang:1.26.8 AS build
WORKDIR /src
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
# The module and build caches outlive the image: a source edit recompiles
# only the packages it touches.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/api ./cmd/dispatcher ./cmd/worker ./cmd/migrate ./cmd/stripe-emulator ./cmd/storefront

# single: one binary as the entrypoint (ARG BIN=api|dispatcher|worker|migrate|stripe-emulator|storefront).
FROM alpine:3.22 AS single
ARG BIN=api
RUN adduser -D -u 10001 app
COPY --from=build /out/${BIN} /usr/local/bin/app
USER app
ENTRYPOINT ["/usr/local/bin/app"]

# dev: every binary, the Stripe emulator and the storefront included (compose's
# stripe-emulator and storefront, the dev overlay); busybox wget serves the
# healthchecks.
FROM alpine:3.22 AS dev
RUN adduser -D -u 10001 app
COPY --from=build /out/ /usr/local/bin/
USER app
CMD ["api"]

# all (default, the last stage): the three production processes and the
# migrate command (compose's migrate service, the Kubernetes Job) only. The
# emulator answers any key and moves no money: an image that ships it lets a
# misconfigured STRIPE_API_BASE take orders without charging (issue 20).
FROM alpine:3.22 AS all
RUN adduser -D -u 10001 app
COPY --from=build /out/api /out/dispatcher /out/worker /out/migrate /usr/local/bin/
USER app
CMD ["api"]
