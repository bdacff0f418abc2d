package docs

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	// spanName is a code span that is a dotted Go name: pkg.Name,
	// pkg.Type.Member, Type.Member, optionally called or starred.
	spanName = regexp.MustCompile(`^\*?\(?\*?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*){1,2})\)?(?:\(.*\))?$`)
	// proseName is a dotted name inside a comment's prose.
	proseName = regexp.MustCompile(`(?:^|[^\w./\[-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*){1,2})(\*|\(|\.\w|/)?`)
	// testName is a code span that names a test, a benchmark, a fuzz
	// target or an example by itself: `TestClaimConcurrent`.
	testName = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)[A-Z_]\w*$`)
	// docLink is a Go doc link: a bracketed Name, pkg.Name, Type.Method or
	// pkg.Type.Method (go.dev/doc/comment#doclinks).
	docLink = regexp.MustCompile(`\[\*?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*){0,2})\]`)
)

// fileExts are the last parts of dotted names that are file names
// (README.md, fastpath.go), not Go names.
var fileExts = []string{"go", "md", "mod", "sum", "yaml", "yml", "json", "sql", "sh", "txt", "html", "js", "css", "png", "toml", "conf", "env", "tsv", "csv", "pem", "proto", "out", "lua", "com", "org", "io", "dev"}

// TestCodeNamesExist: every Go name a page gives in a code span and every
// one a Go comment gives is declared in the module, so a rename or a
// deletion cannot leave a pointer to nothing (issue 36 found a method and
// a type that had gone, still named in comments). A name counts when its first part is
// one of the module's package names (pkg.Name, pkg.Type.Member) or one of
// its type names (Type.Member, the member its own, or promoted from an
// embedded type); names of the standard library and of other modules are
// not checked. A test named alone (`TestClaimConcurrent`) must be declared
// in some package.
func TestCodeNamesExist(t *testing.T) {
	m := loadIndex(t)
	checked := 0
	defer func() { t.Logf("%d names checked", checked) }()
	// check reports name unless it resolves; after is what followed it:
	// "(" a call, "*" a prefix (outbox.TypeOrder*), ".x" or "/" a longer
	// path or host name that is no Go name.
	check := func(where, name, after string) {
		if strings.HasPrefix(after, ".") || after == "/" {
			return
		}
		parts := strings.Split(name, ".")
		last := parts[len(parts)-1]
		if slices.Contains(fileExts, last) {
			return
		}
		// A lower-case last part is a Go name only when called or
		// camel-cased (a method such as run.queueOutcome); otherwise it is a queue
		// (notify.order_paid), an event type (refund.updated) or a column.
		if isLower(last) && after != "(" && (strings.Contains(last, "_") || strings.ToLower(last) == last) {
			return
		}
		if after == "*" {
			if ok, known := m.resolvePrefix(parts); known && !ok {
				t.Errorf("%s: no name of the module starts with %s", where, name)
			}
			return
		}
		ok, known := m.resolve(parts)
		if known && !ok && strings.HasSuffix(last, "X") {
			// problem.CodeX: X stands for any name of that prefix.
			parts[len(parts)-1] = strings.TrimSuffix(last, "X")
			ok, known = m.resolvePrefix(parts)
		}
		if known {
			checked++
		}
		if known && !ok {
			t.Errorf("%s: %s is not declared in the module", where, name)
		}
	}
	for _, p := range pages(t) {
		for i, line := range p.lines {
			for _, s := range codeSpan.FindAllStringSubmatch(line, -1) {
				if testName.MatchString(s[1]) && !m.declares(s[1]) {
					t.Errorf("%s:%d: test %s is not declared in the module", p.path, i+1, s[1])
				}
				if n := spanName.FindStringSubmatch(s[1]); n != nil {
					after := ""
					if strings.HasSuffix(s[1], ")") {
						after = "("
					}
					check(p.path+":"+strconv.Itoa(i+1), n[1], after)
				}
			}
		}
	}
	for rel, f := range m.files {
		pkg := m.byDir[dirOf(rel)]
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				where := m.fset.Position(c.Pos()).String()
				for _, line := range commentProse(c.Text) {
					for _, n := range proseName.FindAllStringSubmatch(line, -1) {
						check(where, n[1], n[2])
					}
					for _, n := range docLink.FindAllStringSubmatch(line, -1) {
						parts := strings.Split(n[1], ".")
						if len(parts) == 1 && isLower(parts[0]) {
							continue // not a doc link: those name exported identifiers
						}
						if len(parts) == 1 || !isLower(parts[0]) {
							// A one-part link, or one whose first part is a type,
							// names the comment's own package.
							if !m.inPackage(pkg, parts) && !isPredeclared(parts[0]) {
								t.Errorf("%s: doc link [%s] names nothing in package %s", where, n[1], pkg.name)
							}
							continue
						}
						check(where, n[1], "(")
					}
				}
			}
		}
	}
}

// inPackage reports whether a doc link of parts (Name, Type.Member) resolves in package p.
func (m *moduleIndex) inPackage(p *pkgIndex, parts []string) bool {
	if !p.top[parts[0]] {
		return false
	}
	return len(parts) == 1 || m.hasMember(parts[0], parts[1])
}

// isPredeclared reports whether name is one of Go's predeclared
// identifiers, which doc links may name ([error]).
func isPredeclared(name string) bool {
	return slices.Contains([]string{"error", "string", "bool", "byte", "rune", "int", "int64", "any", "nil", "true", "false"}, name)
}

// commentProse returns the prose lines of a comment: without the comment
// markers, and without its code blocks (lines indented past the text),
// whose dotted names are variables and fields, not pointers.
func commentProse(text string) []string {
	var out []string
	text = strings.TrimPrefix(strings.TrimSuffix(strings.TrimPrefix(text, "/*"), "*/"), "//")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimPrefix(line, "//")
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "   ") {
			continue
		}
		out = append(out, line)
	}
	return out
}

func dirOf(rel string) string {
	if i := strings.LastIndex(rel, "/"); i >= 0 {
		return rel[:i]
	}
	return "."
}

// declares reports whether some package of the module declares name at
// its top level.
func (m *moduleIndex) declares(name string) bool {
	for _, p := range m.byName {
		if p.top[name] {
			return true
		}
	}
	return false
}
