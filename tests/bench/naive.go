package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/postgres"
)

// The naive checkout (issue 38, "what exactly-once costs"): what a
// checkout with none of the guarantees does, on the same stack (the
// stack's PostgreSQL and Stripe emulator, the same libraries): one Stripe
// create-and-confirm, then one transaction writing the paid order and its
// items. No key, no lease, no outbox, no email: a retry charges again and
// a crash between the two steps loses the order of a charge.
//
// `bench naive` serves it on NAIVE_ADDR over DATABASE_URL and
// STRIPE_API_BASE; naiveCurve drives it with the checkouts' load.
func serveNaive() {
	ctx := context.Background()
	db, err := postgres.Open(ctx, postgres.Config{URL: os.Getenv("DATABASE_URL"), MaxConns: 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(os.Getenv("STRIPE_API_BASE")), MaxNetworkRetries: stripe.Int64(0),
		HTTPClient:      &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
		EnableTelemetry: stripe.Bool(false), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelError},
	})
	pi := paymentintent.Client{B: backend, Key: "sk_test_123"}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	r.POST("/v1/checkouts", func(c *gin.Context) {
		var in struct {
			Email string `json:"email"`
			Items []struct {
				SKU      string `json:"sku"`
				Quantity int64  `json:"quantity"`
			} `json:"items"`
			PaymentMethod string `json:"payment_method"`
		}
		if err := c.ShouldBindJSON(&in); err != nil || len(in.Items) != 1 {
			c.Status(http.StatusBadRequest)
			return
		}
		item := in.Items[0]
		var unit int64
		if err := db.WithContext(c).Raw(`SELECT unit_amount FROM products WHERE sku = ?`, item.SKU).Scan(&unit).Error; err != nil || unit == 0 {
			c.Status(http.StatusBadRequest)
			return
		}
		amount := unit * item.Quantity
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String(in.PaymentMethod), PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
			Confirm: stripe.Bool(true)}
		p.Context = c
		intent, err := pi.New(p)
		if err != nil || intent.Status != stripe.PaymentIntentStatusSucceeded {
			c.Status(http.StatusPaymentRequired)
			return
		}
		id, now := ids.New("ord"), time.Now()
		err = db.WithContext(c).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method,
				payment_intent_id, payment_status, created_at, updated_at)
				VALUES (?, 'acme', 'paid', ?, 'usd', ?, ?, ?, 'succeeded', ?, ?)`,
				id, in.Email, amount, in.PaymentMethod, intent.ID, now, now).Error; err != nil {
				return err
			}
			return tx.Exec(`INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount) VALUES (?, 1, ?, ?, ?, ?)`,
				id, item.SKU, item.Quantity, unit, amount).Error
		})
		if err != nil {
			c.Status(http.StatusInternalServerError)
			return
		}
		c.JSON(http.StatusCreated, gin.H{"id": id, "status": "paid", "amount_total": amount, "payment_intent_id": intent.ID})
	})
	if err := http.ListenAndServe(os.Getenv("NAIVE_ADDR"), r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// naiveCurve measures the naive checkout at every client count of the
// curve, on s's database and Stripe emulator, right after the full
// checkout's curve in the same run: naive_c{n}_per_s, _p50_ms, _p99_ms.
func naiveCurve(c *config, s *stack, f map[string]float64, id string) error {
	if !c.want("naive") {
		return nil
	}
	addr := freeAddr()
	n := &proc{name: "naive", bin: os.Args[0], log: filepath.Join(c.logDir, id+"-naive.log"),
		env: []string{"PATH=" + os.Getenv("PATH"), "NAIVE_ADDR=" + addr, "DATABASE_URL=" + s.dbURL,
			"STRIPE_API_BASE=" + s.stripeURL},
		ready: "http://" + addr + "/healthz"}
	if err := n.start(); err != nil {
		return err
	}
	defer n.stop()
	url := "http://" + addr
	if _, err := wrk(url, clients, 2*time.Second, "new", id+"-naivewarm", "0", "0"); err != nil {
		return err
	}
	for _, k := range curveClients {
		l, err := wrk(url, k, c.dur, "new", id+fmt.Sprintf("-naive%d", k), "0", "0")
		if err != nil {
			return err
		}
		logf("  naive checkout, one sku, %2d clients: %7.1f/s  p50 %6.1f ms  p99 %6.1f ms  errors %d", k, l.Rate, l.P50ms, l.P99ms, l.Errors)
		put(f, fmt.Sprintf("naive_c%d", k), l)
	}
	return nil
}

// tracingPoint measures the 16-client checkout of one sku with tracing
// off and on (every process exporting every span over OTLP/HTTP to a
// receiver in this process, which reads and drops them), each on its own
// fresh database and stack with two seconds of warm-up, one right after
// the other, the order alternating from run to run:
// tracing_off_per_s, tracing_on_per_s.
func tracingPoint(c *config, f map[string]float64, run int, id string) error {
	if !c.want("tracing") {
		return nil
	}
	var bytes, exports atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int64
		buf := make([]byte, 32<<10)
		for {
			k, err := r.Body.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		bytes.Add(n)
		exports.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	points := []struct {
		name string
		env  []string
	}{{"tracing_off", nil}, {"tracing_on", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL}}}
	if run%2 == 1 {
		points[0], points[1] = points[1], points[0]
	}
	for _, p := range points {
		l, err := freshStackLoad(c, c.binDir, "bench_"+p.name+"_"+id, id+p.name[8:], p.env...)
		if err != nil {
			return err
		}
		logf("  checkout, one sku, %d clients, %s: %7.1f/s  p99 %6.1f ms", clients, p.name, l.Rate, l.P99ms)
		put(f, p.name, l)
	}
	f["tracing_export_kib"] = float64(bytes.Load()) / 1024
	if exports.Load() == 0 {
		return fmt.Errorf("tracing on: no process exported a span")
	}
	return nil
}
