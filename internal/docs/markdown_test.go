package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// page is one Markdown file of the repository, split into its prose and
// its fenced code blocks.
type page struct {
	// path is relative to root, with forward slashes.
	path string
	// lines are the prose lines (fenced blocks blanked, so line numbers
	// stay), each with inline code spans kept.
	lines []string
	// blocks are the fenced code blocks.
	blocks []block
	// anchors are the #fragments its headings and <a id> / <a name> tags
	// define.
	anchors map[string]bool
	// headings are its headings' texts.
	headings []string
}

// block is one fenced code block.
type block struct {
	lang string
	line int // of the opening fence, 1-based
	text string
}

// pages returns README.md and every other Markdown file of the repository
// (docs/, bench/, tests/), parsed.
func pages(t testing.TB) []*page {
	t.Helper()
	var out []*page
	err := walkRepo(".md", func(rel string, src []byte) error {
		out = append(out, parsePage(rel, string(src)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// walkRepo calls fn with the slash-separated path (relative to the
// repository's root) and the contents of every file whose name ends in
// ext, skipping hidden folders and skipDirs; fn's error ends the walk.
func walkRepo(ext string, fn func(rel string, src []byte) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ext) {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return fn(filepath.ToSlash(rel), src)
	})
}

var (
	fence     = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([\\w+-]*)")
	heading   = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlID    = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	mdLink    = regexp.MustCompile(`\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]*(?:\([^()]*\))?[^()\s]*)(?:\s+"[^"]*")?\)`)
	refDef    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	inlineMD  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	emphasis  = regexp.MustCompile(`[*_]{1,3}([^*_]+)[*_]{1,3}`)
	htmlTag   = regexp.MustCompile(`<[^>]+>`)
	lineFrag  = regexp.MustCompile(`^L(\d+)(?:-L(\d+))?$`)
	schemeURL = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// parsePage splits src into prose lines and fenced blocks and collects
// its anchors.
func parsePage(path, src string) *page {
	p := &page{path: path, anchors: map[string]bool{}}
	counts := map[string]int{}
	var open *block
	var openFence string
	var body []string
	for i, line := range strings.Split(src, "\n") {
		if open != nil {
			if m := fence.FindStringSubmatch(line); m != nil && strings.HasPrefix(m[1], openFence) && m[2] == "" {
				open.text = strings.Join(body, "\n") + "\n"
				p.blocks = append(p.blocks, *open)
				open, body = nil, nil
			} else {
				body = append(body, line)
			}
			p.lines = append(p.lines, "")
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			open, openFence = &block{lang: m[2], line: i + 1}, m[1]
			p.lines = append(p.lines, "")
			continue
		}
		p.lines = append(p.lines, line)
		if m := heading.FindStringSubmatch(line); m != nil {
			p.headings = append(p.headings, m[2])
			a := anchor(m[2])
			if n := counts[a]; n > 0 {
				p.anchors[a+"-"+strconv.Itoa(n)] = true
			} else {
				p.anchors[a] = true
			}
			counts[a]++
		}
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
	}
	return p
}

// anchor is the fragment GitHub gives a heading of text: the rendered
// text (no code ticks, emphasis, link targets or tags), lower-cased,
// without punctuation other than '-' and '_', each space a '-'.
// (github/cmark-gfm's and github-slugger's rule; a repeated heading gets
// -1, -2, … appended, which parsePage adds.)
func anchor(text string) string {
	text = inlineMD.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	text = strings.ReplaceAll(text, "`", "")
	text = emphasis.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// links returns every link target of the page's prose with its line:
// inline links, images and reference definitions.
func (p *page) links() (targets []string, lines []int) {
	for i, line := range p.lines {
		prose := codeSpan.ReplaceAllString(line, "")
		for _, m := range mdLink.FindAllStringSubmatch(prose, -1) {
			targets, lines = append(targets, m[2]), append(lines, i+1)
		}
		if m := refDef.FindStringSubmatch(prose); m != nil {
			targets, lines = append(targets, m[1]), append(lines, i+1)
		}
	}
	return targets, lines
}

// TestLinksResolve: every relative link of every page names a file or
// directory of the repository, and a #fragment names a heading (or an
// <a id>) of the Markdown page it points into, or a line (#L12, #L12-L20)
// that a file has. A page that moves or a heading reworded breaks a link
// here, not in a reader's browser.
func TestLinksResolve(t *testing.T) {
	ps := pages(t)
	byPath := map[string]*page{}
	for _, p := range ps {
		byPath[p.path] = p
	}
	for _, p := range ps {
		targets, lines := p.links()
		for i, target := range targets {
			if target == "" || schemeURL.MatchString(target) || strings.HasPrefix(target, "//") {
				continue
			}
			where := p.path + ":" + strconv.Itoa(lines[i])
			file, frag, _ := strings.Cut(target, "#")
			dest := p.path
			if file != "" {
				if strings.HasPrefix(file, "/") {
					dest = strings.TrimPrefix(file, "/")
				} else {
					dest = filepath.ToSlash(filepath.Join(filepath.Dir(p.path), file))
				}
				info, err := os.Stat(filepath.Join(root, dest))
				if err != nil {
					t.Errorf("%s: link %q: %s does not exist", where, target, dest)
					continue
				}
				if info.IsDir() || frag == "" {
					continue
				}
			}
			if frag == "" {
				continue
			}
			if m := lineFrag.FindStringSubmatch(frag); m != nil && !strings.HasSuffix(dest, ".md") {
				src, _ := os.ReadFile(filepath.Join(root, dest))
				n := strings.Count(string(src), "\n")
				last, _ := strconv.Atoi(m[len(m)-1])
				if m[2] == "" {
					last, _ = strconv.Atoi(m[1])
				}
				if last > n {
					t.Errorf("%s: link %q: %s has %d lines", where, target, dest, n)
				}
				continue
			}
			to := byPath[dest]
			if to == nil {
				t.Errorf("%s: link %q: a fragment into %s, which is not a Markdown page", where, target, dest)
				continue
			}
			if !to.anchors[frag] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", where, target, dest, frag)
			}
		}
	}
}

// pointer is a pointer to a section of a page by its title, as comments,
// configuration files and pages write them: the page (README, DESIGN.md,
// docs/kubernetes.md), an optional comma, and the title in double quotes.
var pointer = regexp.MustCompile(`\b(README|[A-Z_]+\.md|docs/[\w./-]+\.md)(?:'s)?,? "([^"]+)"`)

// pointerFiles are the files, besides Go and Markdown, that point at
// sections.
var pointerFiles = []string{".yml", ".yaml", ".sh", "Makefile", "Dockerfile"}

// TestSectionPointersResolve: every pointer to a section by its title (the
// page and the title in quotes, in a comment, a YAML file or a page) names
// a heading of that page (one that starts with the title, after any
// "(v3) "), or a list item or bold label that starts with it. CONTRACT.md,
// the spec, is also quoted: there the text may be anywhere. A section that
// moves to another page breaks its pointers here.
func TestSectionPointersResolve(t *testing.T) {
	byPath := map[string]*page{}
	for _, p := range pages(t) {
		byPath[p.path] = p
	}
	check := func(where, text string) {
		for _, m := range pointer.FindAllStringSubmatch(text, -1) {
			file := m[1]
			switch {
			case file == "README":
				file = "README.md"
			case !strings.Contains(file, "/") && file != "README.md":
				file = "docs/" + file
			}
			p := byPath[file]
			if p == nil {
				t.Errorf("%s: %s, %q: no page %s", where, m[1], m[2], file)
				continue
			}
			title := strings.Join(strings.Fields(m[2]), " ")
			if !p.hasSection(title) && !(file == "docs/CONTRACT.md" && p.quotes(title)) {
				t.Errorf("%s: %s, %q: %s has no section of that title", where, m[1], m[2], file)
			}
		}
	}
	for _, p := range pages(t) {
		for i, line := range p.lines {
			check(p.path+":"+strconv.Itoa(i+1), line)
		}
	}
	m := loadIndex(t)
	for rel, f := range m.files {
		for _, cg := range f.Comments {
			check(m.fset.Position(cg.Pos()).String(), strings.ReplaceAll(cg.Text(), "\n", " "))
		}
		_ = rel
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".") && d.Name() != ".github") {
				return filepath.SkipDir
			}
			return nil
		}
		for _, suffix := range pointerFiles {
			if strings.HasSuffix(path, suffix) {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(root, path)
				for i, line := range strings.Split(string(b), "\n") {
					check(filepath.ToSlash(rel)+":"+strconv.Itoa(i+1), line)
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// versionTag is the "(v3) " a contract's heading or item may start with.
var versionTag = regexp.MustCompile(`^\(v\d+\)\s*`)

// quotes reports whether p's prose holds text, whatever the line breaks.
func (p *page) quotes(text string) bool {
	prose := strings.Join(strings.Fields(strings.Join(p.lines, " ")), " ")
	return strings.Contains(strings.ToLower(prose), strings.ToLower(text))
}

// hasSection reports whether p has a section titled title: a heading that
// starts with it, or a list item or bold label that does.
func (p *page) hasSection(title string) bool {
	title = strings.ToLower(versionTag.ReplaceAllString(title, ""))
	for _, h := range p.headings {
		h = strings.ToLower(versionTag.ReplaceAllString(strings.ReplaceAll(h, "`", ""), ""))
		if strings.HasPrefix(h, title) {
			return true
		}
	}
	for _, line := range p.lines {
		l := strings.TrimSpace(line)
		l = strings.TrimPrefix(strings.TrimPrefix(l, "- "), "* ")
		l = strings.ToLower(versionTag.ReplaceAllString(strings.TrimPrefix(l, "**"), ""))
		if l != strings.ToLower(strings.TrimSpace(line)) && strings.HasPrefix(l, title) {
			return true
		}
	}
	return false
}
