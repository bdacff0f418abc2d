// Package architecture holds no code: its test checks the rules of the
// code's shape that a fork inherits, starting with one owner per table
// (docs/DESIGN.md, "v3: one owner per table").
package architecture
