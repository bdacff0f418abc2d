package stack

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// emulatorWebhookEnv is the emulator's environment for Options.Webhooks.
func emulatorWebhookEnv(on bool, apiURL string) []string {
	if !on {
		return nil
	}
	return []string{"STRIPE_EMULATOR_WEBHOOK_URL=" + apiURL + "/v1/webhooks/stripe"}
}

// HookFault injects webhook faults at the emulator (POST
// /_emulator/webhooks/faults): duplicate, shuffle, delay, drop_first.
func (s *Stack) HookFault(faults ...stripeemu.HookFault) {
	s.t.Helper()
	b, _ := json.Marshal(faults)
	s.adminCall(http.MethodPost, "/_emulator/webhooks/faults", b)
}

// ClearHookFaults removes every webhook fault; events a shuffle holds are
// released.
func (s *Stack) ClearHookFaults() {
	s.t.Helper()
	s.adminCall(http.MethodDelete, "/_emulator/webhooks/faults", nil)
}

// TryAuthenticate is Authenticate returning the emulator's refusal (e.g.
// for a PaymentIntent no longer in requires_action) instead of failing.
func (s *Stack) TryAuthenticate(id string, succeed bool) error {
	outcome := "fail"
	if succeed {
		outcome = "succeed"
	}
	resp, err := http30.Post(s.EmulatorURL+"/_emulator/payment_intents/"+id+"/authenticate", "application/json",
		strings.NewReader(fmt.Sprintf(`{"outcome":%q}`, outcome)))
	if err != nil {
		return fmt.Errorf("authenticate %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("authenticate %s: %s %s", id, resp.Status, b)
	}
	return nil
}

// Webhooks returns the emulator's webhook log (GET /_emulator/webhooks).
func (s *Stack) Webhooks() stripeemu.WebhookLog {
	s.t.Helper()
	var l stripeemu.WebhookLog
	s.getJSON(s.EmulatorURL+"/_emulator/webhooks", &l)
	return l
}

// OrderForStripe is the order status CONTRACT.md derives from a
// PaymentIntent's final status: succeeded is paid; requires_payment_method
// (after a failed attempt) and canceled are payment_failed; any other
// status is not final and maps to "".
func OrderForStripe(piStatus string) string {
	switch stripeintent.Status(piStatus) {
	case stripeintent.Succeeded:
		return string(orders.Paid)
	case stripeintent.RequiresPaymentMethod, stripeintent.Canceled:
		return string(orders.PaymentFailed)
	}
	return ""
}
