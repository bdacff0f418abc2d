// Package deploy holds no code: its tests check what the repository ships to
// run the service.
//
// docker-compose.yml, the Dockerfile and .dockerignore at the repository
// root, against CONTRACT.md (services, ports, healthchecks, dependency
// conditions and environment variables) and against the defects of issues 8,
// 20 and 34: no host port a local PostgreSQL, Redis or RabbitMQ holds, every
// port on loopback by default, a fixed project name, hostname and named
// volumes for the stateful services, a build context of only what the build
// reads and every go build of the Dockerfile run on only that context (the
// files `go list -deps` names), cache mounts and a Go image that satisfies
// go.mod, supported image lines, healthchecks that mean ready (Postgres over
// TCP, RabbitMQ's quorum queues with a leader) without flooding the logs, no
// Stripe emulator in the default image and an emulator image built from the
// emulator's packages alone, and images that run as uid and gid 10001.
//
// scripts/run.sh (make run): the variables a restarted process needs, its
// addresses on loopback by default, and the demo line it prints.
//
// deploy/k8s, rendered in-process with kustomize's library: every object of
// every overlay, the built-in kinds decoded strictly into k8s.io/api's types
// and the custom resources validated against their operators' CRDs
// (testdata/crds); the wiring CONTRACT.md's Deployment section asks for; the
// PrometheusRule generated from deploy/prometheus/alerts.yml; and no
// development key in the production overlay.
package deploy
