// Package architecture holds no code: its tests check the rules of the
// code's shape that a fork inherits: one owner per table (docs/DESIGN.md,
// "v3: one owner per table") and one error model (only internal/problem
// turns a code into an HTTP status).
package architecture
