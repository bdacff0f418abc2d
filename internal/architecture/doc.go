// Package architecture holds no code: its tests check the rules of the
// code's shape that a fork inherits: one owner per table (docs/DESIGN.md,
// "v3: one owner per table"), one error model (only internal/problem
// turns a code into an HTTP status) and HTTP at the edge (the domain
// packages import no router, decoder or handler; internal/api serves them).
package architecture
