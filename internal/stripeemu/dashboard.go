package stripeemu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
)

// What a person does in Stripe's Dashboard, which the service learns only
// from webhooks and from reading Stripe: cancel a PaymentIntent, refund a
// payment. Neither carries the service's idempotency keys or metadata, and
// the Dashboard's cancel may set a cancellation_reason the API's cancel
// cannot (Stripe sets failed_invoice, void_invoice and automatic itself:
// https://docs.stripe.com/api/payment_intents/object#payment_intent_object-cancellation_reason).

// DashboardCancellationReasons are every cancellation_reason a
// PaymentIntent may carry
// (https://docs.stripe.com/api/payment_intents/object#payment_intent_object-cancellation_reason):
// the four the API's cancel accepts and the ones Stripe sets on its own.
var DashboardCancellationReasons = []string{
	"duplicate", "fraudulent", "requested_by_customer", "abandoned",
	"failed_invoice", "void_invoice", "automatic",
}

// DashboardCancel cancels PaymentIntent id as the Dashboard does, with
// cancellation_reason reason ("" for none, else one of
// DashboardCancellationReasons), under the same rule as the API's cancel
// (https://docs.stripe.com/api/payment_intents/cancel: only
// requires_payment_method, requires_capture, requires_confirmation,
// requires_action or processing), and emits payment_intent.canceled. It
// returns the PaymentIntent's JSON; ErrNotFound, ErrWrongState for a
// status that cannot be canceled, or an error for an unknown reason.
func (e *Emulator) DashboardCancel(id, reason string) ([]byte, error) {
	if reason != "" && !slices.Contains(DashboardCancellationReasons, reason) {
		return nil, fmt.Errorf("cancellation_reason %q: want one of %v", reason, DashboardCancellationReasons)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.intents[id]
	if !ok {
		return nil, ErrNotFound
	}
	switch s.pi.Status {
	case statusRequiresPaymentMethod, statusRequiresCapture, statusRequiresConfirmation, statusRequiresAction, statusProcessing:
	default:
		return nil, fmt.Errorf("%w: payment_intent %s is %s and cannot be canceled", ErrWrongState, id, s.pi.Status)
	}
	e.cancelLocked(s, reason)
	return mustJSON(e.renderPILocked(s, nil)), nil
}

// cancelLocked cancels s for reason ("" none) and emits
// payment_intent.canceled; the caller holds mu and has checked the status.
func (e *Emulator) cancelLocked(s *storedIntent, reason string) {
	now := e.now().Unix()
	s.pi.Status, s.pi.CanceledAt, s.pi.NextAction = statusCanceled, &now, nil
	if reason != "" {
		s.pi.CancellationReason = &reason
	}
	s.pi.AmountCapturable = 0
	e.emitPILocked("payment_intent.canceled", s)
}

// DashboardRefund refunds amount (0: what is left) of PaymentIntent
// piID's charge as the Dashboard does: with reason ("" none, else one of
// requested_by_customer, duplicate, fraudulent), no idempotency key and no
// metadata, under the rules of POST /v1/refunds
// (https://docs.stripe.com/api/refunds/create), emitting refund.created
// and charge.refunded as Stripe does for any refund
// (https://docs.stripe.com/api/events/types#event_types-charge.refunded).
// It returns the refund's JSON; ErrNotFound, or ErrWrongState wrapping
// Stripe's message for a payment that cannot be refunded for that amount.
func (e *Emulator) DashboardRefund(piID string, amount int64, reason string) ([]byte, error) {
	p := refundParams{paymentIntent: piID, metadata: map[string]string{}}
	if amount > 0 {
		p.amount = &amount
	}
	if reason != "" {
		if !refundReasons[reason] {
			return nil, fmt.Errorf("reason %q: want requested_by_customer, duplicate or fraudulent", reason)
		}
		p.reason = &reason
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.intents[piID]
	if !ok {
		return nil, ErrNotFound
	}
	resp := e.refundLocked(s.apiKey, p)
	if resp.status != http.StatusOK {
		return nil, fmt.Errorf("%w: %s", ErrWrongState, resp.body)
	}
	return resp.body, nil
}

// postDashboardCancel serves POST /_emulator/payment_intents/{id}/dashboard_cancel
// with an optional body {"cancellation_reason":"requested_by_customer"}:
// 200 with the PaymentIntent; 400 unknown reason; 404 unknown; 409 a
// status that cannot be canceled.
func (e *Emulator) postDashboardCancel(w http.ResponseWriter, r *http.Request) {
	var in struct {
		CancellationReason string `json:"cancellation_reason"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
			writeAdminError(w, http.StatusBadRequest, err)
			return
		}
	}
	if in.CancellationReason != "" && !slices.Contains(DashboardCancellationReasons, in.CancellationReason) {
		writeAdminError(w, http.StatusBadRequest, fmt.Errorf("cancellation_reason %q: want one of %v", in.CancellationReason, DashboardCancellationReasons))
		return
	}
	body, err := e.DashboardCancel(r.PathValue("id"), in.CancellationReason)
	if err != nil {
		writeControlError(w, err)
		return
	}
	e.logger.Info("stripe emulator: PaymentIntent canceled in the Dashboard", "payment_intent", r.PathValue("id"), "reason", in.CancellationReason)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// postDashboardRefund serves POST /_emulator/payment_intents/{id}/dashboard_refund
// with an optional body {"amount":1000,"reason":"requested_by_customer"}:
// 200 with the refund; 400 unknown reason; 404 unknown PaymentIntent; 409
// when Stripe would refuse the refund.
func (e *Emulator) postDashboardRefund(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount int64  `json:"amount"`
		Reason string `json:"reason"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
			writeAdminError(w, http.StatusBadRequest, err)
			return
		}
	}
	if in.Reason != "" && !refundReasons[in.Reason] {
		writeAdminError(w, http.StatusBadRequest, fmt.Errorf("reason %q: want requested_by_customer, duplicate or fraudulent", in.Reason))
		return
	}
	body, err := e.DashboardRefund(r.PathValue("id"), in.Amount, in.Reason)
	if err != nil {
		writeControlError(w, err)
		return
	}
	e.logger.Info("stripe emulator: payment refunded in the Dashboard", "payment_intent", r.PathValue("id"), "amount", in.Amount)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
