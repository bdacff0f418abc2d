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
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out = append(out, parsePage(filepath.ToSlash(rel), string(src)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
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
