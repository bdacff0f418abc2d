// Package deploy holds no code: its tests check docker-compose.yml, the
// Dockerfile and .dockerignore at the repository root against CONTRACT.md
// (services, ports, healthchecks, dependency conditions and environment
// variables) and against the defects of issue 8: no host port a local
// PostgreSQL, Redis or RabbitMQ holds, a fixed hostname and named volumes for
// the stateful services, a build context of only what the build reads, cache
// mounts and a Go image that satisfies go.mod, supported image lines, and
// healthchecks that mean ready (Postgres over TCP) without flooding the logs.
package deploy
