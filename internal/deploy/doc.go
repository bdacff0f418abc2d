// Package deploy holds no code: its test checks docker-compose.yml and the
// Dockerfile at the repository root against CONTRACT.md (services, ports,
// healthchecks, dependency conditions and environment variables).
package deploy
