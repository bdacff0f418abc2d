package webhooks

import (
	"context"
	"encoding/json"
	"fmt"

	"gorm.io/gorm"
)

// Refund is Stripe's state of one refund (https://docs.stripe.com/api/refunds/object),
// as a refund.* event's data.object or a charge.refunded event's charge
// gives it.
type Refund struct {
	ID              string // "re_…"
	Status          string // pending, requires_action, succeeded, failed, canceled
	Amount          int64
	Currency        string
	PaymentIntentID string
	FailureReason   string
	// OrderID and TenantID come from the refund's metadata, which the
	// service sets when it creates a refund. The refund's own id in the
	// service is in metadata[refund_id] when present.
	OrderID  string
	TenantID string
	RefundID string
	// Metadata is the refund's metadata (string values only).
	Metadata map[string]string
	// Reason is Stripe's reason for the refund, "" for none.
	Reason string
	// IntentOrderID and IntentTenantID name the order of the refund's
	// PaymentIntent, from the PaymentIntent's metadata (which every
	// PaymentIntent the service creates carries): the handler reads them
	// from Stripe for a refund made outside the service (the Dashboard),
	// which carries none of our metadata, so that it reaches its order.
	IntentOrderID, IntentTenantID string
}

// SetMetadata sets r.Metadata to md and, from it, OrderID, TenantID and
// RefundID (metadata order_id, tenant_id and refund_id, which the service
// sets on the refunds it creates; missing keys leave them empty).
func (r *Refund) SetMetadata(md map[string]string) {
	r.Metadata = md
	r.OrderID, r.TenantID, r.RefundID = md["order_id"], md["tenant_id"], md["refund_id"]
}

// Ours reports whether the refund carries the metadata the service sets on
// the refunds it creates: its own refund id, or the order and tenant.
func (r Refund) Ours() bool { return r.RefundID != "" || (r.OrderID != "" && r.TenantID != "") }

// MadeOutside reports whether the refund was not created by the service's
// refund API (no metadata[refund_id]) but refunds a PaymentIntent: a refund
// made in Stripe's Dashboard, say, which may be one of an order's refunds.
func (r Refund) MadeOutside() bool { return r.RefundID == "" && r.PaymentIntentID != "" }

// Refunds is what the handler needs of the refunds feature: apply Stripe's
// state of a refund to the service's rows inside the caller's transaction,
// only forward (a pending refund may succeed or fail; a succeeded or failed
// one never changes again). It reports changed=false when the state was
// already known or older than ours, and returns an error wrapping
// ErrNotOurs for a refund the service does not know. Any other error rolls
// the caller's transaction back, the inbox record included.
//
// RefundsOf lists Stripe's refunds of a PaymentIntent, newest first, with
// the API's list (GET /v1/refunds?payment_intent=…, strongly consistent,
// unlike the search): a charge.refunded event of an API version since
// 2022-11-15 no longer embeds the charge's refunds
// (https://docs.stripe.com/upgrades#2022-11-15), so the handler asks for
// them. An error means Stripe did not answer.
type Refunds interface {
	ApplyRefund(ctx context.Context, tx *gorm.DB, r Refund) (changed bool, err error)
	RefundsOf(ctx context.Context, paymentIntentID string) ([]Refund, error)
}

type refundJSON struct {
	ID             string         `json:"id"`
	Object         string         `json:"object"`
	Status         string         `json:"status"`
	Amount         int64          `json:"amount"`
	Currency       string         `json:"currency"`
	PaymentIntent  any            `json:"payment_intent"` // an id, or the object when expanded
	FailureReason  string         `json:"failure_reason"`
	Reason         *string        `json:"reason"`
	Metadata       map[string]any `json:"metadata"`
	ChargeRefunded *struct {
		Data []json.RawMessage `json:"data"`
	} `json:"refunds"` // on a charge: its refunds, when the API version embeds them
}

func (j refundJSON) refund() Refund {
	r := Refund{ID: j.ID, Status: j.Status, Amount: j.Amount, Currency: j.Currency, FailureReason: j.FailureReason}
	if j.Reason != nil {
		r.Reason = *j.Reason
	}
	switch pi := j.PaymentIntent.(type) {
	case string:
		r.PaymentIntentID = pi
	case map[string]any:
		r.PaymentIntentID, _ = pi["id"].(string)
	}
	md := map[string]string{}
	for k, v := range j.Metadata {
		if s, ok := v.(string); ok {
			md[k] = s
		}
	}
	r.SetMetadata(md)
	return r
}

// DecodeRefunds returns the refunds an event's data.object holds: the
// refund itself (refund.* events), or the refunds a charge embeds
// (charge.refunded in API versions before 2022-11-15). For a charge that
// embeds none (later versions) it returns embedded false and the charge's
// PaymentIntent, whose refunds the caller lists (Refunds.RefundsOf).
func DecodeRefunds(raw []byte) (rs []Refund, embedded bool, paymentIntentID string, err error) {
	var j refundJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, false, "", fmt.Errorf("%w: refund: %w", ErrMalformedEvent, err)
	}
	switch j.Object {
	case "refund":
		return []Refund{j.refund()}, true, "", nil
	case "charge":
		if j.ChargeRefunded == nil {
			return nil, false, j.refund().PaymentIntentID, nil
		}
		var out []Refund
		for _, d := range j.ChargeRefunded.Data {
			var rj refundJSON
			if err := json.Unmarshal(d, &rj); err != nil {
				return nil, false, "", fmt.Errorf("%w: charge refund: %w", ErrMalformedEvent, err)
			}
			if rj.ID != "" {
				out = append(out, rj.refund())
			}
		}
		return out, true, "", nil
	}
	return nil, false, "", fmt.Errorf("%w: not a refund or a charge (object %q)", ErrMalformedEvent, j.Object)
}
