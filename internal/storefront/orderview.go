package storefront

import (
	"strings"
	"time"

	"github.com/onceonly/checkout/client"
)

// orderView is the order as its page and the page's polling show it: in
// the shopper's words, not the API's.
type orderView struct {
	Order *client.Order `json:"order"`
	// Status is the order's status (the API's word, for scripts and
	// tests); StatusText says it to the shopper.
	Status     client.OrderStatus `json:"status"`
	StatusText string             `json:"status_text"`
	// Reason says why the payment failed or the order was canceled, as
	// the storefront learned it (a decline, a failed 3D Secure, a cancel
	// from the order page), "" otherwise.
	Reason string `json:"reason,omitempty"`
	// Lines are the order's items with the products' names.
	Lines []orderLine `json:"lines"`
	// Waiting: the customer must authenticate; Settled: the status will
	// not change but through a refund.
	Waiting bool `json:"waiting"`
	Settled bool `json:"settled"`
	// RedirectURL is the 3D Secure challenge while Waiting.
	RedirectURL string `json:"redirect_url,omitempty"`
	// EmailSent is when the paid email was sent, "" until then.
	EmailSent string `json:"email_sent,omitempty"`
}

// orderLine is an order's item with its product's name.
type orderLine struct {
	client.OrderItem
	Name string `json:"name"`
}

// statusText says an order's status to the shopper.
var statusText = map[client.OrderStatus]string{
	client.OrderPendingPayment:    "Processing your payment",
	client.OrderRequiresAction:    "Waiting for you to confirm the payment with your bank",
	client.OrderPaymentUnknown:    "Checking the payment with your bank",
	client.OrderPaid:              "Paid",
	client.OrderPaymentFailed:     "Payment failed",
	client.OrderCanceled:          "Canceled",
	client.OrderPartiallyRefunded: "Paid, partly refunded",
	client.OrderRefunded:          "Refunded",
}

// The reasons the storefront learns, in the shopper's words.
const (
	// reasonThreeDSFailed: Stripe sent the customer back from 3D Secure
	// with redirect_status=failed
	// (https://docs.stripe.com/payments/3d-secure/authentication-flow#manual-redirect).
	reasonThreeDSFailed = "Your bank's 3D Secure check was not passed, so the payment was refused. Nothing was charged."
	// reasonCanceled: the customer canceled from the order page.
	reasonCanceled = "You canceled the order before confirming the payment. Nothing was charged."
	// reasonNotConfirmed: the order waited for 3D Secure and failed
	// without a failed check coming back here: the confirmation was not
	// finished in time.
	reasonNotConfirmed = "The payment was not confirmed with your bank in time. Nothing was charged."
	// reasonFailed: a failure the storefront knows nothing more of.
	reasonFailed = "The payment did not go through. Nothing was charged."
)

// declineText says a declined card's reason, from Stripe's decline_code
// (https://docs.stripe.com/declines/codes).
func declineText(code string) string {
	why := map[string]string{
		"insufficient_funds":     "the card has insufficient funds",
		"lost_card":              "the card is reported lost",
		"stolen_card":            "the card is reported stolen",
		"expired_card":           "the card has expired",
		"incorrect_cvc":          "the card's security code is wrong",
		"card_velocity_exceeded": "the card's limit is reached",
	}[code]
	if why == "" {
		why = "your bank gave no reason"
	}
	return "Your card was declined (" + why + "). Nothing was charged."
}

// viewOf returns the page's view of o, with ref's reason and the names of
// the catalog's products.
func viewOf(o *client.Order, ref orderRef, catalog []client.Product) orderView {
	v := orderView{Order: o, Status: o.Status, StatusText: statusText[o.Status],
		Waiting: o.Status == client.OrderRequiresAction}
	if v.StatusText == "" {
		v.StatusText = strings.ReplaceAll(string(o.Status), "_", " ")
	}
	switch o.Status {
	case client.OrderPendingPayment, client.OrderRequiresAction, client.OrderPaymentUnknown:
	default:
		v.Settled = true
	}
	switch {
	case o.Status != client.OrderPaymentFailed && o.Status != client.OrderCanceled:
	case ref.Reason != "":
		v.Reason = ref.Reason
	case ref.ThreeDS:
		v.Reason = reasonNotConfirmed
	case o.Status == client.OrderPaymentFailed:
		v.Reason = reasonFailed
	}
	for _, it := range o.Items {
		l := orderLine{OrderItem: it, Name: it.SKU}
		for _, p := range catalog {
			if p.SKU == it.SKU {
				l.Name = p.Name
			}
		}
		v.Lines = append(v.Lines, l)
	}
	if na := o.Payment.NextAction; na != nil && na.RedirectToURL != nil {
		v.RedirectURL = na.RedirectToURL.URL
	}
	for _, n := range o.Notifications {
		if n.Kind == "order_paid" && n.SentAt != nil {
			v.EmailSent = n.SentAt.Format(time.RFC3339)
		}
	}
	return v
}
