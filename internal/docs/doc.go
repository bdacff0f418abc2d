// Package docs holds no code: its tests keep the documentation from going
// stale (STYLE.md 16) and the module forkable:
//
//   - TestLinksResolve: every relative link in README.md and the repository's
//     other Markdown pages names a file that exists, and every #anchor a
//     heading of that page (GitHub's anchor rules).
//   - TestCodeNamesExist: every code name the pages give in backticks
//     (`pkg.Name`, `Type.Method`) and every one the Go comments give
//     (pkg.Name, Type.Method, doc links [pkg.Name]) is declared in the module.
//   - TestSnippetsCompile: README.md's and docs/*.md's Go snippets compile.
//   - TestForkBuilds: the tree that gonew (golang.org/x/tools/cmd/gonew)
//     makes of the module under another module path builds, vets and passes
//     its unit tests (docs/fork.md).
package docs
