package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// config is what the demo reads from the environment (see the package doc).
type config struct {
	API, APIKey, Sink, Emulator string
	// DatabaseURL is DATABASE_URL, "" for the detected stack's default.
	DatabaseURL string
	// PostgresPort is CHECKOUT_POSTGRES_PORT, compose's published port.
	PostgresPort string
	// Color is false when NO_COLOR is set (https://no-color.org): no bold
	// step titles, even on a terminal.
	Color bool
}

func loadConfig(getenv func(string) string) config {
	or := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	return config{
		API:          or("API", "http://127.0.0.1:8080"),
		APIKey:       or("API_KEY", "sk_test_acme"),
		Sink:         strings.TrimSuffix(or("SINK", "http://127.0.0.1:8025"), "/"),
		Emulator:     strings.TrimSuffix(or("EMU", "http://127.0.0.1:12111"), "/"),
		DatabaseURL:  getenv("DATABASE_URL"),
		PostgresPort: or("CHECKOUT_POSTGRES_PORT", "15432"),
		Color:        getenv("NO_COLOR") == "",
	}
}

// email is one email the sink caught.
type email struct {
	MessageID, Subject string
}

// sink is the SMTP sink's HTTP side: make run's cmd/smtp-sink or compose's
// Mailpit.
type sink interface {
	// Name says which stack it belongs to.
	Name() string
	// Emails returns the emails whose subject names order id.
	Emails(ctx context.Context, id string) ([]email, error)
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// getJSON decodes the 200 answer of GET u into v.
func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// detectSink asks base which sink it is: Mailpit answers GET /api/v1/info
// with its version, cmd/smtp-sink answers GET /messages with a JSON array.
func detectSink(ctx context.Context, base string) (sink, error) {
	var info struct {
		Version string `json:"Version"`
	}
	if err := getJSON(ctx, base+"/api/v1/info", &info); err == nil && info.Version != "" {
		return mailpit{base}, nil
	}
	var ms []json.RawMessage
	if err := getJSON(ctx, base+"/messages", &ms); err == nil {
		return smtpSink{base}, nil
	}
	return nil, fmt.Errorf("SINK %s is neither make run's SMTP sink (GET /messages) nor compose's Mailpit (GET /api/v1/info): is the stack up? Set SINK to the sink's HTTP address", base)
}

// smtpSink is make run's cmd/smtp-sink.
type smtpSink struct{ base string }

func (smtpSink) Name() string { return "make run (cmd/smtp-sink)" }

func (s smtpSink) Emails(ctx context.Context, id string) ([]email, error) {
	var ms []struct {
		MessageID string `json:"message_id"`
		Subject   string `json:"subject"`
	}
	if err := getJSON(ctx, s.base+"/messages", &ms); err != nil {
		return nil, err
	}
	var out []email
	for _, m := range ms {
		if strings.Contains(m.Subject, id) {
			out = append(out, email{m.MessageID, m.Subject})
		}
	}
	return out, nil
}

// mailpit is compose's Mailpit (its API: https://mailpit.axllent.org/docs/api-v1/).
type mailpit struct{ base string }

func (mailpit) Name() string { return "docker compose (Mailpit)" }

func (m mailpit) Emails(ctx context.Context, id string) ([]email, error) {
	var res struct {
		Messages []struct {
			MessageID string `json:"MessageID"`
			Subject   string `json:"Subject"`
		} `json:"messages"`
	}
	if err := getJSON(ctx, m.base+"/api/v1/search?query="+url.QueryEscape(id), &res); err != nil {
		return nil, err
	}
	var out []email
	for _, msg := range res.Messages {
		if strings.Contains(msg.Subject, id) {
			out = append(out, email{"<" + strings.Trim(msg.MessageID, "<>") + ">", msg.Subject})
		}
	}
	return out, nil
}

// databaseURL is DATABASE_URL, else the default of the stack s is part of,
// with the reason for the choice.
func (c config) databaseURL(s sink) (string, string) {
	if c.DatabaseURL != "" {
		return c.DatabaseURL, "DATABASE_URL"
	}
	if _, ok := s.(mailpit); ok {
		return "postgres://postgres@127.0.0.1:" + c.PostgresPort + "/checkout?sslmode=disable",
			"the compose stack's database, published on CHECKOUT_POSTGRES_PORT (" + c.PostgresPort + ")"
	}
	return "postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable", "make run's default DATABASE_URL"
}
