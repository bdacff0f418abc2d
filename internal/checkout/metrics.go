package checkout

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts what the payment saga cannot settle by itself. A nil
// *Metrics counts nothing.
type Metrics struct {
	unknownTotal prometheus.Counter
}

// NewMetrics registers on reg (reusing what another Service registered
// there already):
//
//	checkout_payments_unknown_total  orders moved to payment_unknown (PAYMENT_UNKNOWN_AFTER of failed reconciliation)
func NewMetrics(reg prometheus.Registerer) *Metrics {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "checkout_payments_unknown_total",
		Help: "Orders whose payment outcome stayed unknown for PAYMENT_UNKNOWN_AFTER and became payment_unknown.",
	})
	if reg != nil {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(fmt.Sprintf("checkout: register metrics: %v", err))
			}
			c = are.ExistingCollector.(prometheus.Counter)
		}
	}
	return &Metrics{unknownTotal: c}
}

func (m *Metrics) unknown() {
	if m != nil {
		m.unknownTotal.Inc()
	}
}
