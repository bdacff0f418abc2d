package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// root is the module's root, relative to this package's directory (where
// go test runs its tests).
var root = filepath.Join("..", "..")

// skipDirs are directories that hold no module code or pages of ours.
var skipDirs = map[string]bool{".git": true, "node_modules": true, "testdata": true, "vendor": true, "bin": true}

// pkgIndex is what one Go package of the module declares.
type pkgIndex struct {
	// name is the package clause's name (an external test package
	// "x_test" counts as x).
	name string
	// dirs are the directories, relative to root, of the packages of this
	// name.
	dirs []string
	// top holds the top-level identifiers: functions, types, variables,
	// constants.
	top map[string]bool
	// methods are the names of its types' methods: docs may name a method
	// by its package (checkout.settle).
	methods map[string]bool
}

// typeIndex is what the module's types of one name declare, across
// packages (two packages may each have a Store).
type typeIndex struct {
	// members are methods, struct fields and interface methods.
	members map[string]bool
	// embeds are the type names embedded in it, whose members it promotes.
	embeds map[string]bool
}

// moduleIndex holds every declaration of the module.
type moduleIndex struct {
	// byName is the module's packages by package name (several
	// directories may share one name: they are merged).
	byName map[string]*pkgIndex
	// byDir is the package of each directory, relative to root.
	byDir map[string]*pkgIndex
	// types are the module's types by name.
	types map[string]*typeIndex
	// files are the parsed Go files by path relative to root.
	files map[string]*ast.File
	fset  *token.FileSet
}

var (
	indexOnce sync.Once
	index     *moduleIndex
	indexErr  error
)

// loadIndex parses every Go file of the module once per test binary.
func loadIndex(t testing.TB) *moduleIndex {
	t.Helper()
	indexOnce.Do(func() { index, indexErr = buildIndex() })
	if indexErr != nil {
		t.Fatal(indexErr)
	}
	return index
}

func buildIndex() (*moduleIndex, error) {
	m := &moduleIndex{byName: map[string]*pkgIndex{}, byDir: map[string]*pkgIndex{},
		types: map[string]*typeIndex{}, files: map[string]*ast.File{}, fset: token.NewFileSet()}
	err := walkRepo(".go", func(rel string, src []byte) error {
		f, err := parser.ParseFile(m.fset, rel, src, parser.ParseComments)
		if err != nil {
			return err
		}
		m.files[rel] = f
		m.add(filepath.ToSlash(filepath.Dir(rel)), f)
		return nil
	})
	return m, err
}

func (m *moduleIndex) typ(name string) *typeIndex {
	ti := m.types[name]
	if ti == nil {
		ti = &typeIndex{members: map[string]bool{}, embeds: map[string]bool{}}
		m.types[name] = ti
	}
	return ti
}

// add records f's declarations under its package.
func (m *moduleIndex) add(dir string, f *ast.File) {
	name := strings.TrimSuffix(f.Name.Name, "_test")
	p := m.byName[name]
	if p == nil {
		p = &pkgIndex{name: name, top: map[string]bool{}, methods: map[string]bool{}}
		m.byName[name] = p
	}
	if m.byDir[dir] == nil {
		p.dirs = append(p.dirs, dir)
	}
	m.byDir[dir] = p
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				p.top[d.Name.Name] = true
				continue
			}
			p.methods[d.Name.Name] = true
			if recv := typeName(d.Recv.List[0].Type); recv != "" {
				m.typ(recv).members[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.top[n.Name] = true
					}
				case *ast.TypeSpec:
					p.top[s.Name.Name] = true
					m.addType(m.typ(s.Name.Name), s.Type)
				}
			}
		}
	}
}

// addType records the fields, interface methods and embedded types of a
// type's definition.
func (m *moduleIndex) addType(ti *typeIndex, expr ast.Expr) {
	var fields *ast.FieldList
	switch t := expr.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return
	}
	for _, f := range fields.List {
		if len(f.Names) == 0 {
			if n := typeName(f.Type); n != "" {
				ti.embeds[n] = true
				ti.members[n] = true // an embedded field is named for its type
			}
			continue
		}
		for _, n := range f.Names {
			ti.members[n.Name] = true
		}
	}
}

// typeName is the name of the (possibly pointer, qualified or generic)
// type expr, "" for other expressions.
func typeName(expr ast.Expr) string {
	switch t := expr.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	}
	return ""
}

// hasMember reports whether a type named typ in the module has a method or
// field (its own or promoted) named member.
func (m *moduleIndex) hasMember(typ, member string) bool {
	seen := map[string]bool{}
	var has func(string) bool
	has = func(typ string) bool {
		if seen[typ] {
			return false
		}
		seen[typ] = true
		ti := m.types[typ]
		if ti == nil {
			return false
		}
		if ti.members[member] {
			return true
		}
		for e := range ti.embeds {
			if has(e) {
				return true
			}
		}
		return false
	}
	return has(typ)
}

// resolve reports whether the dotted name (pkg.Name, pkg.Type.Member,
// Type.Member) names a declaration of the module; known is false when the
// name's first part is neither a package nor a type of the module (a
// standard library or other module's name, which this test does not
// check).
func (m *moduleIndex) resolve(parts []string) (ok, known bool) {
	if p := m.byName[parts[0]]; p != nil && isLower(parts[0]) {
		switch len(parts) {
		case 2:
			return p.top[parts[1]] || p.methods[parts[1]], true
		case 3:
			return p.top[parts[1]] && m.hasMember(parts[1], parts[2]), true
		}
		return false, false
	}
	if _, isType := m.types[parts[0]]; isType && len(parts) == 2 {
		return m.hasMember(parts[0], parts[1]), true
	}
	return false, false
}

func isLower(s string) bool { return s != "" && s[0] >= 'a' && s[0] <= 'z' }

// resolvePrefix is resolve for a name whose last part is a prefix
// (outbox.TypeOrder* in a comment).
func (m *moduleIndex) resolvePrefix(parts []string) (ok, known bool) {
	p := m.byName[parts[0]]
	if p == nil || !isLower(parts[0]) || len(parts) != 2 {
		return false, false
	}
	for name := range p.top {
		if strings.HasPrefix(name, parts[1]) {
			return true, true
		}
	}
	return false, true
}
