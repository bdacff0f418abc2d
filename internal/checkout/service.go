package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/refunds"
)

// Service runs checkouts. All fields are required.
type Service struct {
	DB       *gorm.DB
	Keys     *idempotency.Store
	Payments PaymentProvider
	Logger   *slog.Logger
	// Now is the clock (the same one Keys uses).
	Now func() time.Time
}

// Checkout executes, resumes or replays the checkout that req identifies.
// in is the decoded body and inputErrs what decoding found wrong with it;
// they are reported only after the stored-key rules, as the contract orders.
//
// It returns the final response, which is stored under the key (201 paid,
// 402 card_declined, 409 out_of_stock), and whether it is a replay. Errors
// are problems that are not stored: 422 idempotency_key_reused, 409
// idempotency_key_in_use, 400 validation_error, 502
// payment_provider_unavailable and 503 unavailable (the key keeps its
// recovery point and a retry resumes it).
func (s *Service) Checkout(ctx context.Context, req *idempotency.Request, in *Request, inputErrs []FieldError) (resp *idempotency.Response, replayed bool, err error) {
	var (
		claim *idempotency.Claim
		order *Order
		final *idempotency.Response
	)
	err = postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		c, err := s.Keys.Claim(ctx, tx, req.Scope, req.Fingerprint, req.Owner)
		if err != nil {
			return err
		}
		claim = c
		switch {
		case c.Response != nil:
			return nil
		case c.TakenOver:
			order, err = s.resumedOrder(ctx, tx, c)
			return err
		}
		order, final, err = s.createOrder(ctx, tx, c, in, inputErrs)
		return err
	})
	if err != nil {
		return nil, false, s.translate(err)
	}
	if final != nil {
		return final, false, nil // finished by this request (out of stock)
	}
	if claim.Response != nil {
		return claim.Response, true, nil
	}
	if claim.TakenOver {
		s.Logger.InfoContext(ctx, "resuming checkout after an expired lease", "order_id", order.ID, "recovery_point", claim.RecoveryPoint)
	}
	resp, err = s.pay(ctx, claim, order)
	return resp, false, err
}

// Complete finishes the unfinished checkout of key id whose lease has
// expired, with the same Stripe key and parameters a retry would use. It
// reports false when there was nothing to do (finished meanwhile, lease live,
// or another completer holds the row). The completer calls it.
func (s *Service) Complete(ctx context.Context, keyID int64) (bool, error) {
	var (
		claim *idempotency.Claim
		order *Order
	)
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		c, err := s.Keys.TakeOver(ctx, tx, keyID, idempotency.NewOwnerToken())
		if err != nil || c == nil {
			return err
		}
		if c.Scope.Route != Route {
			return nil
		}
		claim = c
		order, err = s.resumedOrder(ctx, tx, c)
		return err
	})
	if err != nil || claim == nil {
		return false, err
	}
	s.Logger.InfoContext(ctx, "completing checkout after an expired lease", "order_id", order.ID, "key_hash", claim.Scope.Hash()[:16])
	if _, err := s.pay(ctx, claim, order); err != nil {
		return false, err
	}
	return true, nil
}

// createOrder is transaction 1 after a new claim: validate, reserve stock,
// insert the order and its order.created event, advance the recovery
// point. When stock is short it finishes the key with a stored 409 instead
// and returns that as final.
func (s *Service) createOrder(ctx context.Context, tx *gorm.DB, c *idempotency.Claim, in *Request, inputErrs []FieldError) (*Order, *idempotency.Response, error) {
	// Any error returned from here rolls the claim back: nothing is stored,
	// and the same key can be sent again with a corrected body.
	errs := in.validate(inputErrs)

	want := map[string]int64{}
	for _, it := range in.Items {
		if checkToken(it.SKU, 64) == "" { // only well-formed skus reach the database
			want[it.SKU] += int64(it.Quantity)
		}
	}
	skus := make([]string, 0, len(want))
	for sku := range want {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	products, err := loadProducts(ctx, tx, skus)
	if err != nil {
		return nil, nil, err
	}
	for i, it := range in.Items {
		if _, ok := products[it.SKU]; !ok && checkToken(it.SKU, 64) == "" {
			errs = append(errs, FieldError{fmt.Sprintf("items[%d].sku", i), fmt.Sprintf("unknown sku %q", it.SKU)})
		}
	}
	if len(errs) > 0 {
		return nil, nil, ValidationError(errs)
	}
	currency := products[in.Items[0].SKU].Currency
	for i, it := range in.Items {
		if products[it.SKU].Currency != currency {
			errs = append(errs, FieldError{fmt.Sprintf("items[%d].sku", i), "all items must have the same currency"})
		}
	}
	if len(errs) > 0 {
		return nil, nil, ValidationError(errs)
	}

	// The order is written before the stock is reserved: a product row is
	// hot (every checkout of the SKU updates it), so its lock is taken last
	// and held only until the commit. Out of stock rolls back to here.
	if err := tx.SavePoint("before_order").Error; err != nil {
		return nil, nil, fmt.Errorf("savepoint: %w", err)
	}
	now := s.Now().UTC().Truncate(time.Microsecond)
	o := &Order{
		ID:            ids.New("ord"),
		Status:        StatusPendingPayment,
		Email:         in.Email,
		Currency:      currency,
		Payment:       Payment{Provider: "stripe"},
		CreatedAt:     now,
		tenantID:      c.Scope.Tenant,
		paymentMethod: in.PaymentMethod,
	}
	for _, it := range in.Items {
		p := products[it.SKU]
		amount := p.UnitAmount * int64(it.Quantity)
		o.Items = append(o.Items, OrderItem{SKU: it.SKU, Quantity: it.Quantity, UnitAmount: p.UnitAmount, Amount: amount})
		o.AmountTotal += amount
	}
	if err := insertOrder(ctx, tx, o); err != nil {
		return nil, nil, err
	}
	if err := outbox.Add(ctx, tx, s.event(outbox.TypeOrderCreated, o, now)); err != nil {
		return nil, nil, err
	}
	if err := s.Keys.Advance(ctx, tx, c, RecoveryPointOrderCreated, o.ID); err != nil {
		return nil, nil, err
	}
	reserved, err := reserveStock(ctx, tx, want)
	if err != nil {
		return nil, nil, err
	}
	if !reserved {
		if err := tx.RollbackTo("before_order").Error; err != nil {
			return nil, nil, fmt.Errorf("rollback to savepoint: %w", err)
		}
		resp := idempotency.ProblemResponse(ErrOutOfStock)
		if err := s.Keys.Finish(ctx, tx, c, resp); err != nil {
			return nil, nil, err
		}
		return nil, resp, nil
	}
	return o, nil, nil
}

// resumedOrder loads the order of a key taken over at order_created.
func (s *Service) resumedOrder(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (*Order, error) {
	if c.RecoveryPoint != RecoveryPointOrderCreated || c.OrderID == "" {
		return nil, fmt.Errorf("key %d: cannot resume at recovery point %q", c.ID, c.RecoveryPoint)
	}
	o, err := loadOrder(ctx, tx, c.Scope.Tenant, c.OrderID)
	if err != nil {
		return nil, err
	}
	if o.Status != StatusPendingPayment {
		return nil, fmt.Errorf("key %d: order %s is %s, not pending", c.ID, o.ID, o.Status)
	}
	return o, nil
}

// pay is phases 2 and 3: charge with the step's deterministic key, then
// settle the order and finish the key in transaction 2.
func (s *Service) pay(ctx context.Context, c *idempotency.Claim, o *Order) (*idempotency.Response, error) {
	res, err := s.Payments.Charge(ctx, ChargeRequest{
		IdempotencyKey: StepKey(c.Scope.Tenant, c.Scope.Key, o.ID, StepPaymentIntent),
		Amount:         o.AmountTotal,
		Currency:       o.Currency,
		PaymentMethod:  o.paymentMethod,
		OrderID:        o.ID,
		TenantID:       c.Scope.Tenant,
	})
	if err != nil {
		s.release(c)
		return nil, problem.Wrap(ErrPaymentUnavailable, err)
	}

	var (
		resp      *idempotency.Response
		eventType string
	)
	o.Payment = Payment{Provider: "stripe", PaymentIntentID: res.PaymentIntentID, Status: res.Status}
	switch {
	case !res.Declined && res.Status == "succeeded":
		o.Status, eventType = StatusPaid, outbox.TypeOrderPaid
		body, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		resp = idempotency.JSONResponse(201, body, "/v1/orders/"+o.ID)
	case res.Declined || noMoneyMoved(res.Status):
		o.Status, eventType = StatusPaymentFailed, outbox.TypeOrderPaymentFailed
		p := ErrCardDeclined.With("order_id", o.ID)
		if res.DeclineCode != "" {
			p = p.With("decline_code", res.DeclineCode)
		}
		resp = idempotency.ProblemResponse(p)
	default:
		// processing, requires_capture: money may still move, so the order
		// must not be settled either way yet. Keep the recovery point.
		s.release(c)
		return nil, problem.Wrap(ErrPaymentUnavailable,
			fmt.Errorf("payment intent %s is %s", res.PaymentIntentID, res.Status))
	}

	now := s.Now().UTC().Truncate(time.Microsecond)
	err = postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		// Finish first: it is the fence, and it locks the key row, so a
		// takeover that happened meanwhile stops us before any other write.
		if err := s.Keys.Finish(ctx, tx, c, resp); err != nil {
			return err
		}
		if err := settleOrder(ctx, tx, o, now); err != nil {
			return err
		}
		if o.Status == StatusPaymentFailed {
			release := map[string]int64{}
			for _, it := range o.Items {
				release[it.SKU] += int64(it.Quantity)
			}
			if err := adjustStock(ctx, tx, release); err != nil {
				return err
			}
		}
		return outbox.Add(ctx, tx, s.event(eventType, o, now))
	})
	if err != nil {
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			s.release(c)
		}
		return nil, s.translate(err)
	}
	return resp, nil
}

// noMoneyMoved reports PaymentIntent statuses in which no funds moved and
// none will without the customer: the order fails and its stock returns.
func noMoneyMoved(status string) bool {
	switch status {
	case "requires_payment_method", "requires_confirmation", "requires_action", "canceled":
		return true
	}
	return false
}

func (s *Service) event(typ string, o *Order, at time.Time) outbox.Event {
	return outbox.Event{Type: typ, OccurredAt: at, TenantID: o.tenantID, AggregateID: o.ID, Data: o}
}

// release ends the key's lease early after a transient failure, so the
// client's retry resumes at once rather than after the lease expires.
func (s *Service) release(c *idempotency.Claim) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Keys.Release(ctx, s.DB, c); err != nil {
		s.Logger.Warn("release key lease", "err", err, "key_hash", c.Scope.Hash()[:16])
	}
}

// errUnstorable answers input the database rejects as data (SQLSTATE class
// 22, e.g. a NUL byte in a string) that validation did not catch: a retry
// would fail the same way, so it must not be a retryable 503.
var errUnstorable = ValidationError([]FieldError{{Field: "", Message: "contains characters that cannot be stored"}})

// translate keeps problems as they are, turns a data exception into 400,
// and turns anything else (the database failing, a deadline) into 503
// unavailable, wrapping the cause for the log.
func (s *Service) translate(err error) error {
	var p *problem.Problem
	if errors.As(err, &p) {
		return err
	}
	if postgres.IsDataException(err) {
		return problem.Wrap(errUnstorable, err)
	}
	return problem.Wrap(ErrUnavailable, err)
}

// Products returns the catalog with current stock.
func (s *Service) Products(ctx context.Context) ([]Product, error) {
	ps, err := listProducts(ctx, s.DB)
	if err != nil {
		return nil, s.translate(err)
	}
	return ps, nil
}

// OrderView is an order with its notifications, as GET /v1/orders/{id}
// returns it.
type OrderView struct {
	*Order
	// AmountRefunded is the sum of the order's succeeded refunds.
	AmountRefunded int64            `json:"amount_refunded"`
	Refunds        []refunds.Refund `json:"refunds"`
	Notifications  []Notification   `json:"notifications"`
}

// Order returns tenant's order id with its notifications, or
// ErrOrderNotFound.
func (s *Service) Order(ctx context.Context, tenantID, id string) (*OrderView, error) {
	if !validOrderID(id) {
		return nil, ErrOrderNotFound // not even shaped like an id: no query
	}
	o, err := loadOrder(ctx, s.DB, tenantID, id)
	if err != nil {
		return nil, s.translate(err)
	}
	ns, err := notificationsFor(ctx, s.DB, id)
	if err != nil {
		return nil, s.translate(err)
	}
	rs, err := refunds.ForOrder(ctx, s.DB, id)
	if err != nil {
		return nil, s.translate(err)
	}
	var refunded int64
	for _, r := range rs {
		if r.Status == refunds.StatusSucceeded {
			refunded += r.Amount
		}
	}
	return &OrderView{Order: o, AmountRefunded: refunded, Refunds: rs, Notifications: ns}, nil
}

// validOrderID reports whether id has the form ids.New("ord") gives:
// "ord_" and 32 lowercase hex digits.
func validOrderID(id string) bool {
	if len(id) != 36 || id[:4] != "ord_" {
		return false
	}
	for i := 4; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
