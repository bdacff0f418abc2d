package stack

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one span an OTLP receiver collected, flattened: the ids in hex
// as the W3C traceparent writes them, and the service.name of the process
// that exported it.
type Span struct {
	Service      string
	Name         string
	TraceID      string
	SpanID       string
	ParentSpanID string
	// Links are the trace ids the span links to.
	Links []string
	// Start and End are when the span ran.
	Start, End time.Time
}

// OTLPReceiver is an in-process OpenTelemetry collector for the tests: it
// serves OTLP/HTTP's trace export (POST /v1/traces, protobuf; see
// https://opentelemetry.io/docs/specs/otlp/#otlphttp) and keeps every span
// the stack's processes send, which a test points them at with
// OTEL_EXPORTER_OTLP_ENDPOINT=URL.
type OTLPReceiver struct {
	// URL is the receiver's base URL (OTEL_EXPORTER_OTLP_ENDPOINT).
	URL string

	srv   *httptest.Server
	mu    sync.Mutex
	spans []Span
}

// NewOTLPReceiver starts a receiver and closes it in t's cleanup.
func NewOTLPReceiver(t TB) *OTLPReceiver {
	r := &OTLPReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = httptest.NewServer(mux)
	r.URL = r.srv.URL
	t.Cleanup(r.srv.Close)
	return r
}

func (r *OTLPReceiver) export(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var in coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range in.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{Service: service, Name: sp.GetName(), TraceID: hex.EncodeToString(sp.GetTraceId()),
					SpanID: hex.EncodeToString(sp.GetSpanId()), ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
					Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano()))}
				for _, l := range sp.GetLinks() {
					s.Links = append(s.Links, hex.EncodeToString(l.GetTraceId()))
				}
				got = append(got, s)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Trace returns the spans collected so far of traceID (hex).
func (r *OTLPReceiver) Trace(traceID string) []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, s := range r.spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Spans returns every span collected so far.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}
