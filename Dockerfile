# The service's images; docker-compose.yml and the Kubernetes manifests
# (deploy/k8s) pick the process with `command`.
# Build: docker build -t checkout .  (target all: api, dispatcher, worker, migrate)
# Every binary, the Stripe emulator and the storefront included, for the
# storefront and the dev overlay: docker build --target dev -t checkout-dev .
# The Stripe emulator alone (compose's stripe-emulator, the dev overlay's
# onceonly/checkout-emulator:dev): docker build --target emulator -t onceonly/checkout-emulator:dev .
# A single binary: docker build --build-arg BIN=worker --target single -t checkout-worker .
# Needs BuildKit (the default builder since Docker Engine 23) for the cache mounts.
# .dockerignore lets in only what the builds read: go.mod, go.sum, client/,
# cmd/, internal/ and migrations/ (embedded), without tests; internal/deploy
# runs each go build below on only that (TestImageBuildsFromItsContext).

# The tag names a patch release at or above go.mod's `go` line
# (internal/deploy checks it): a bare 1.26 could be an older cached image.
FROM golang:1.26.8 AS modules
WORKDIR /src
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

FROM modules AS build
COPY . .
# The module and build caches outlive the image: a source edit recompiles
# only the packages it touches.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/api ./cmd/dispatcher ./cmd/worker ./cmd/migrate ./cmd/stripe-emulator ./cmd/storefront

# build-emulator: the Stripe emulator from its own packages only (what
# `go list -deps ./cmd/stripe-emulator` names in this module; internal/deploy
# checks the list). An edit elsewhere leaves these layers, and so the
# emulator's image, as they were: `docker compose up --build` after it keeps
# the emulator's container, and the PaymentIntents it holds in memory.
FROM modules AS build-emulator
COPY internal/stripeemu/ internal/stripeemu/
COPY cmd/stripe-emulator/ cmd/stripe-emulator/
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/stripe-emulator

# runtime: the base of every image, which runs as uid and gid 10001 by
# number (Kubernetes' runAsNonRoot can verify only a numeric USER, and
# deploy/k8s runs the pods as 10001), with that user and group in
# /etc/passwd and /etc/group. Busybox wget serves compose's healthchecks.
FROM alpine:3.22 AS runtime
RUN addgroup -g 10001 app && adduser -D -H -u 10001 -G app app
USER 10001:10001

# single: one binary as the entrypoint (ARG BIN=api|dispatcher|worker|migrate|stripe-emulator|storefront).
FROM runtime AS single
ARG BIN=api
COPY --from=build /out/${BIN} /usr/local/bin/app
ENTRYPOINT ["/usr/local/bin/app"]

# emulator: the Stripe emulator alone (compose's stripe-emulator).
FROM runtime AS emulator
COPY --from=build-emulator /out/stripe-emulator /usr/local/bin/
CMD ["stripe-emulator"]

# dev: every binary, the Stripe emulator and the storefront included
# (compose's storefront, the dev overlay).
FROM runtime AS dev
COPY --from=build /out/ /usr/local/bin/
CMD ["api"]

# all (default, the last stage): the three production processes and the
# migrate command (compose's migrate service, the Kubernetes Job) only. The
# emulator answers any key and moves no money: an image that ships it lets a
# misconfigured STRIPE_API_BASE take orders without charging (issue 20).
FROM runtime AS all
COPY --from=build /out/api /out/dispatcher /out/worker /out/migrate /usr/local/bin/
CMD ["api"]
