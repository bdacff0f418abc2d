# One image with every binary of the service; docker-compose.yml picks the
# process with `command`. Build: docker build -t checkout .
# A single binary: docker build --build-arg BIN=worker --target single -t checkout-worker .

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...

# single: one binary as the entrypoint (ARG BIN=api|dispatcher|worker|stripe-emulator|smtp-sink).
FROM alpine:3.22 AS single
ARG BIN=api
RUN adduser -D -u 10001 app
COPY --from=build /out/${BIN} /usr/local/bin/app
USER app
ENTRYPOINT ["/usr/local/bin/app"]

# all (default): every binary on PATH; busybox wget serves the healthchecks.
FROM alpine:3.22 AS all
RUN adduser -D -u 10001 app
COPY --from=build /out/ /usr/local/bin/
USER app
CMD ["api"]
