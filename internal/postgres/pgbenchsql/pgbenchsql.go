// Package pgbenchsql keeps a pgbench script honest: it records the SQL
// statements GORM sends (with their placeholders, not their values) and
// compares them, normalized, with the statements of a pgbench script that
// claims to do the same work. `make bench` runs the script with pgbench to
// measure what the database can do with the service's own SQL; a test that
// fails when the code's statements change and the script does not keeps the
// two in step.
package pgbenchsql

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
)

// Recorder collects the statements a *gorm.DB executes while it is on.
type Recorder struct {
	mu    sync.Mutex
	on    bool
	stmts []string
}

// Record registers callbacks on db that append every statement's SQL (with
// $n placeholders) to the recorder while it is on, and registers the
// recorder as db's postgres.BatchObserver, which records a batch's
// statements between the lines \startpipeline and \endpipeline, as a
// pgbench script sends a pipeline. db's callbacks are shared by every
// session of it, so register once per test database.
func Record(db *gorm.DB) (*Recorder, error) {
	r := &Recorder{}
	if err := db.Use(r); err != nil {
		return nil, fmt.Errorf("pgbenchsql: register batch observer: %w", err)
	}
	record := func(tx *gorm.DB) {
		if tx.Error != nil || tx.Statement == nil {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.on {
			r.stmts = append(r.stmts, tx.Statement.SQL.String())
		}
	}
	cb := db.Callback()
	for _, err := range []error{
		// Before the associations, which GORM inserts after the row itself.
		cb.Create().After("gorm:create").Before("gorm:save_after_associations").Register("pgbenchsql:create", record),
		cb.Query().After("gorm:query").Register("pgbenchsql:query", record),
		cb.Update().After("gorm:update").Register("pgbenchsql:update", record),
		cb.Delete().After("gorm:delete").Register("pgbenchsql:delete", record),
		cb.Row().After("gorm:row").Register("pgbenchsql:row", record),
		cb.Raw().After("gorm:raw").Register("pgbenchsql:raw", record),
	} {
		if err != nil {
			return nil, fmt.Errorf("pgbenchsql: register callback: %w", err)
		}
	}
	return r, nil
}

// Name is the recorder's name as a GORM plugin (postgres.BatchObserverName).
func (r *Recorder) Name() string { return postgres.BatchObserverName }

// Initialize does nothing: Record registers the callbacks.
func (r *Recorder) Initialize(*gorm.DB) error { return nil }

// ObserveBatch records a batch's statements, between \startpipeline and
// \endpipeline.
func (r *Recorder) ObserveBatch(stmts []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.stmts = append(append(append(r.stmts, `\startpipeline`), stmts...), `\endpipeline`)
	}
}

// Start clears what was recorded and starts recording.
func (r *Recorder) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.stmts = true, nil
}

// Stop stops recording and returns the statements recorded since Start,
// normalized (see Normalize).
func (r *Recorder) Stop() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	out := make([]string, len(r.stmts))
	for i, s := range r.stmts {
		out[i] = Normalize(s)
	}
	return out
}

var (
	lineComment = regexp.MustCompile(`--[^\n]*`)
	placeholder = regexp.MustCompile(`\$\d+|\?|(^|[^:]):[A-Za-z_][A-Za-z0-9_]*`)
	null        = regexp.MustCompile(`(?i)\bnull\b`)
	gset        = regexp.MustCompile(`\\gset(\s+\w+)?$`)
	space       = regexp.MustCompile(`\s+`)
	tight       = regexp.MustCompile(`\s*([(),=<>])\s*`)
)

// Normalize makes a statement comparable across GORM and pgbench: comments
// dropped, identifiers unquoted, every placeholder ($1, ?, :name) written
// as ?, and so is NULL (a pgbench variable cannot be NULL, a GORM
// parameter can), whitespace collapsed, lower case.
func Normalize(s string) string {
	s = lineComment.ReplaceAllString(s, " ")
	s = strings.ReplaceAll(s, `"`, "")
	s = placeholder.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, "$") || m == "?" {
			return "?"
		}
		if m[0] != ':' { // the character before the colon
			return m[:1] + "?"
		}
		return "?"
	})
	s = null.ReplaceAllString(s, "?")
	s = strings.TrimSpace(space.ReplaceAllString(s, " "))
	s = tight.ReplaceAllString(s, "$1")
	s = strings.TrimSuffix(s, ";")
	return strings.ToLower(s)
}

// Script returns the normalized SQL statements of the pgbench script at
// path: meta-commands (\set, ...) and transaction control (BEGIN, COMMIT,
// END) left out, since GORM's callbacks do not see the latter either,
// except \startpipeline and \endpipeline, which stand where a batch
// begins and ends. A
// statement ends with a semicolon, or pgbench's \gset, at the end of a line.
func Script(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var (
		out []string
		cur strings.Builder
	)
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(lineComment.ReplaceAllString(line, ""))
		if cur.Len() == 0 && (trimmed == `\startpipeline` || trimmed == `\endpipeline`) {
			out = append(out, trimmed)
			continue
		}
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, `\`)) {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") || gset.MatchString(trimmed) {
			s := Normalize(gset.ReplaceAllString(strings.TrimSpace(cur.String()), ""))
			cur.Reset()
			switch s {
			case "begin", "commit", "end":
				continue
			}
			out = append(out, s)
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		return nil, fmt.Errorf("%s: a statement does not end with a semicolon", path)
	}
	return out, nil
}
