package stack

import (
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"
)

// Waterfall renders spans (one trace) as a self-contained HTML page in the
// manner of a trace UI's timeline: one row per span, children under their
// parent, a bar from its start to its end, coloured by process. Jaeger's
// UI needs a container this machine cannot run; the docs' picture of one
// checkout's trace is this page in headless Chromium (tests/e2e).
func Waterfall(title string, spans []Span) string {
	if len(spans) == 0 {
		return ""
	}
	children := map[string][]Span{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	var roots []Span
	for _, s := range spans {
		if ids[s.ParentSpanID] {
			children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b Span) int { return a.Start.Compare(b.Start) }
	slices.SortFunc(roots, byStart)
	start, end := spans[0].Start, spans[0].End
	for _, s := range spans {
		if s.Start.Before(start) {
			start = s.Start
		}
		if s.End.After(end) {
			end = s.End
		}
	}
	total := end.Sub(start)
	if total <= 0 {
		total = time.Millisecond
	}
	colors := map[string]string{"checkout-storefront": "#9467bd", "checkout-api": "#1f77b4",
		"checkout-dispatcher": "#ff7f0e", "checkout-worker": "#2ca02c"}
	type row struct {
		Depth                   int
		Service, Name, Duration string
		Left, Width             float64
		Color                   string
	}
	var rows []row
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		color := colors[s.Service]
		if color == "" {
			color = "#7f7f7f"
		}
		rows = append(rows, row{Depth: depth, Service: strings.TrimPrefix(s.Service, "checkout-"), Name: s.Name,
			Duration: fmtDuration(s.End.Sub(s.Start)),
			Left:     100 * float64(s.Start.Sub(start)) / float64(total),
			Width:    max(0.15, 100*float64(s.End.Sub(s.Start))/float64(total)), Color: color})
		kids := children[s.SpanID]
		slices.SortFunc(kids, byStart)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	var b strings.Builder
	_ = waterfallPage.Execute(&b, map[string]any{"Title": title, "Rows": rows, "Total": fmtDuration(total),
		"Spans": len(spans), "TraceID": spans[0].TraceID})
	return b.String()
}

func fmtDuration(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

var waterfallPage = template.Must(template.New("w").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title><style>
body{font:13px system-ui,sans-serif;margin:16px;color:#222;width:1200px}
h1{font-size:17px;margin:0 0 4px} p{margin:0 0 12px;color:#555}
.row{display:flex;align-items:center;height:20px;border-bottom:1px solid #f0f0f0}
.label{width:420px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.svc{display:inline-block;width:74px;color:#fff;border-radius:3px;padding:0 4px;margin-right:6px;font-size:11px;text-align:center}
.track{position:relative;flex:1;height:12px}
.bar{position:absolute;height:12px;border-radius:2px;min-width:2px}
.dur{position:absolute;font-size:11px;color:#555;top:-1px;white-space:nowrap}
</style></head><body>
<h1>{{.Title}}</h1>
<p>trace {{.TraceID}} · {{.Spans}} spans · {{.Total}}, from the POST to the SMTP send</p>
{{range .Rows}}<div class="row"><div class="label" style="padding-left:{{.Depth}}0px"><span class="svc" style="background:{{.Color}}">{{.Service}}</span>{{.Name}}</div>
<div class="track"><div class="bar" style="left:{{printf "%.3f" .Left}}%;width:{{printf "%.3f" .Width}}%;background:{{.Color}}"></div><div class="dur" style="left:calc({{printf "%.3f" .Left}}% + {{printf "%.3f" .Width}}% + 4px)">{{.Duration}}</div></div></div>
{{end}}</body></html>`))
