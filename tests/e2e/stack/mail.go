package stack

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/onceonly/checkout/internal/notify/smtpsink"
)

// MailOutage makes the SMTP sink fail until MailRestore (PUT /outage):
// mode "reject" answers every message with reply code (a 4xx is
// temporary), "refuse" closes its SMTP port. The emails it accepted stay
// readable (Messages).
func (s *Stack) MailOutage(mode string, code int) {
	s.t.Helper()
	b, _ := json.Marshal(smtpsink.Outage{Mode: mode, Code: code})
	s.sinkCall(http.MethodPut, b)
}

// MailRestore ends a MailOutage (DELETE /outage).
func (s *Stack) MailRestore() {
	s.t.Helper()
	s.sinkCall(http.MethodDelete, nil)
}

func (s *Stack) sinkCall(method string, body []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.SinkURL+"/outage", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http30.Do(req)
	if err != nil {
		s.t.Fatalf("stack: sink %s /outage: %v", method, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		s.t.Fatalf("stack: sink %s /outage: %s %s", method, resp.Status, b)
	}
}
