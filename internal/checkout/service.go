package checkout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/refunds"
)

// Service runs checkouts and their payment sagas. DB, Keys, Payments,
// Logger and Now are required.
type Service struct {
	DB       *gorm.DB
	Keys     *idempotency.Store
	Payments PaymentProvider
	Logger   *slog.Logger
	// Now is the clock (the same one Keys uses).
	Now func() time.Time
	// Saga tunes the payment saga; see SagaConfig.
	Saga SagaConfig
	// Metrics counts payment outcomes; nil counts nothing.
	Metrics *Metrics
	// StrayRefunds refunds a PaymentIntent that moved money for an order
	// that is not paid (SettleStrayPayment); nil: such a payment is only
	// counted and logged. *payments.Client implements it.
	StrayRefunds refunds.Stripe

	catalog catalog // prices and currencies of first executions
}

// CheckoutCommand is one POST /v1/checkouts as the gateway admitted it: the
// key's scope, the request's fingerprint and lease owner, and the decoded
// body with what decoding found wrong with it (reported only after the
// stored-key rules, as the contract orders).
type CheckoutCommand struct {
	// Tenant and IdempotencyKey name the key (its route is Route).
	Tenant, IdempotencyKey string
	// Fingerprint is the request's fingerprint (idempotency.Fingerprint).
	Fingerprint string
	// Owner is this execution's lease token.
	Owner string
	// Input is the decoded body; InputErrors what decoding found wrong.
	Input       *Request
	InputErrors []FieldError
}

// Checkout executes, resumes or replays the checkout cmd names.
//
// It returns the final response, stored under the key (201 paid, 202
// requires_action, 402 card_declined or payment_rejected, 409
// out_of_stock), and whether it is a replay. Errors are not stored:
// idempotency.ErrKeyReused (422), idempotency.ErrKeyInUse and ErrLeaseLost
// (409), and *Error with code validation_error (400),
// payment_provider_unavailable (502: the key keeps its recovery point and
// a retry resumes it) or unavailable (503).
func (s *Service) Checkout(ctx context.Context, cmd CheckoutCommand) (resp *idempotency.Response, replayed bool, err error) {
	switch first, err := s.beginFirst(ctx, cmd); {
	case err != nil:
		return nil, false, s.translate(err)
	case first != nil && first.final != nil:
		return first.final, false, nil // out of stock
	case first != nil:
		resp, err = s.newRun(first.claim, Route, first.order).payFirst(ctx, first.create)
		return resp, false, err
	}
	// Not a first execution (the key exists, or the body is wrong): the
	// general path, which reads what is stored and applies the contract's
	// rules in its order.
	scope := idempotency.Scope{Tenant: cmd.Tenant, Route: Route, Key: cmd.IdempotencyKey}
	var (
		claim *idempotency.Claim
		order *Order
		final *idempotency.Response
	)
	err = postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		c, err := s.Keys.Claim(ctx, tx, scope, cmd.Fingerprint, cmd.Owner)
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
		in := cmd.Input
		if in == nil {
			in = &Request{}
		}
		order, final, err = s.createOrder(ctx, tx, c, in, cmd.InputErrors)
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
	resp, err = s.newRun(claim, Route, order).pay(ctx)
	return resp, false, err
}

// KeyRoutes are the routes whose keys Complete resumes: the checkout
// (Route) and the cancellation (CancelRoute), every route of this package
// that takes an Idempotency-Key. The worker's completer hands it exactly
// these (internal/api.Completer).
func (s *Service) KeyRoutes() []string { return []string{Route, CancelRoute} }

// Complete finishes the unfinished key id whose lease has expired, through
// the same saga a client's retry would run, with the same Stripe keys: a
// checkout (Route) or a cancellation (CancelRoute). Keys of other routes
// are not touched (not even taken over). It reports false when there was
// nothing to do (finished meanwhile, lease live, another process holds the
// row, another route). While it works it extends the key's lease every
// Keys.Lease/3, as the API's gateway does. The completer and the reconciler
// call it.
func (s *Service) Complete(ctx context.Context, keyID int64) (bool, error) {
	var (
		claim *idempotency.Claim
		order *Order
	)
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		c, err := s.Keys.TakeOver(ctx, tx, keyID, idempotency.NewOwnerToken(), s.KeyRoutes()...)
		if err != nil || c == nil {
			return err
		}
		claim = c
		order, err = s.resumedOrder(ctx, tx, c)
		return err
	})
	if err != nil || claim == nil {
		return false, err
	}
	stop := s.Keys.KeepLease(ctx, s.DB, claim.Scope, claim.Owner, s.Logger)
	defer stop()
	s.Logger.InfoContext(ctx, "completing an unfinished key after an expired lease",
		"order_id", order.ID, "route", claim.Scope.Route, "key_hash", claim.Scope.Hash()[:16])
	var runErr error
	if claim.Scope.Route == CancelRoute {
		_, runErr = s.cancelOrder(ctx, claim, order)
	} else {
		_, runErr = s.newRun(claim, Route, order).pay(ctx)
	}
	if runErr != nil {
		return false, runErr
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
	want, skus := in.wanted()
	products, err := loadProducts(ctx, tx, skus)
	if err != nil {
		return nil, nil, err
	}
	if errs = append(errs, in.unknownSKUs(products)...); len(errs) > 0 {
		return nil, nil, ValidationError(errs)
	}
	if errs = in.mixedCurrencies(products); len(errs) > 0 {
		return nil, nil, ValidationError(errs)
	}
	o := s.newOrder(c.Scope.Tenant, in, products)
	now := o.CreatedAt
	// One statement reserves the stock and, only if it could, writes the
	// order, its items, its order.created event and the key's recovery
	// point: out of stock leaves nothing to roll back.
	event, eventArgs, err := outbox.Statement(s.event(outbox.TypeOrderCreated, o, now))
	if err != nil {
		return nil, nil, err
	}
	advance, advanceArgs := s.Keys.AdvanceStatement(c, RecoveryPointOrderCreated, o.ID)
	reserved, advanced, err := createOrderReserving(ctx, tx, o, want, event, eventArgs, advance, advanceArgs)
	if err != nil {
		return nil, nil, err
	}
	if !reserved {
		resp := responseForError(ErrOutOfStock)
		if err := s.Keys.Finish(ctx, tx, c, resp); err != nil {
			return nil, nil, err
		}
		return nil, resp, nil
	}
	if !advanced {
		return nil, nil, idempotency.ErrLeaseLost
	}
	c.Advanced(RecoveryPointOrderCreated, o.ID)
	return o, nil, nil
}

// wanted returns the units wanted of each well-formed sku (the same sku
// may be on several lines), and those skus in order: only they reach the
// database.
func (in *Request) wanted() (map[string]int64, []string) {
	want := map[string]int64{}
	for _, it := range in.Items {
		if checkToken(it.SKU, 64) == "" {
			want[it.SKU] += int64(it.Quantity)
		}
	}
	skus := make([]string, 0, len(want))
	for sku := range want {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	return want, skus
}

// unknownSKUs reports the items whose well-formed sku is not among products
// (the catalog rows of the skus wanted returned).
func (in *Request) unknownSKUs(products map[string]Product) []FieldError {
	var errs []FieldError
	for i, it := range in.Items {
		if _, ok := products[it.SKU]; !ok && checkToken(it.SKU, 64) == "" {
			errs = append(errs, FieldError{fmt.Sprintf("items[%d].sku", i), fmt.Sprintf("unknown sku %q", it.SKU)})
		}
	}
	return errs
}

// mixedCurrencies reports the items whose currency is not the first item's;
// every sku must be in products (no unknownSKUs).
func (in *Request) mixedCurrencies(products map[string]Product) []FieldError {
	var errs []FieldError
	currency := products[in.Items[0].SKU].Currency
	for i, it := range in.Items {
		if products[it.SKU].Currency != currency {
			errs = append(errs, FieldError{fmt.Sprintf("items[%d].sku", i), "all items must have the same currency"})
		}
	}
	return errs
}

// newOrder returns tenant's new order for in (valid, every sku in
// products), pending payment, created now, with a new id.
func (s *Service) newOrder(tenant string, in *Request, products map[string]Product) *Order {
	o := &Order{
		ID:            ids.New("ord"),
		Status:        StatusPendingPayment,
		Email:         in.Email,
		Currency:      products[in.Items[0].SKU].Currency,
		Payment:       Payment{Provider: "stripe"},
		CreatedAt:     s.Now().UTC().Truncate(time.Microsecond),
		tenantID:      tenant,
		paymentMethod: in.PaymentMethod,
		returnURL:     in.ReturnURL,
	}
	for _, it := range in.Items {
		p := products[it.SKU]
		amount := p.UnitAmount * int64(it.Quantity)
		o.Items = append(o.Items, OrderItem{SKU: it.SKU, Quantity: it.Quantity, UnitAmount: p.UnitAmount, Amount: amount})
		o.AmountTotal += amount
	}
	return o
}

// resumedOrder loads the order of a key taken over at its recovery point.
func (s *Service) resumedOrder(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (*Order, error) {
	want := RecoveryPointOrderCreated
	if c.Scope.Route == CancelRoute {
		want = RecoveryPointCancelRequested
	}
	if c.RecoveryPoint != want || c.OrderID == "" {
		return nil, fmt.Errorf("key %d: cannot resume at recovery point %q", c.ID, c.RecoveryPoint)
	}
	return loadOrder(ctx, tx, c.Scope.Tenant, c.OrderID)
}

func (s *Service) event(typ string, o *Order, at time.Time) outbox.Event {
	return outbox.Event{Type: typ, OccurredAt: at, TenantID: o.tenantID, AggregateID: o.ID, Data: o}
}

// release ends the key's lease early after a transient failure
// (idempotency.Store.ReleaseEarly, retried through a database failover).
func (s *Service) release(c *idempotency.Claim) {
	s.Keys.ReleaseEarly(s.DB, c, s.Logger)
}

// translate keeps domain errors and the idempotency layer's problems as
// they are, turns a data exception (SQLSTATE class 22, e.g. a NUL byte in a
// string that validation did not catch: a retry would fail the same way)
// into a validation_error, and anything else (the database failing, a
// deadline) into unavailable, wrapping the cause for the log.
func (s *Service) translate(err error) error {
	var e *Error
	var p *problem.Error
	switch {
	case errors.As(err, &e), errors.As(err, &p):
		return err
	case postgres.IsDataException(err):
		v := ValidationError([]FieldError{{Field: "", Message: "contains characters that cannot be stored"}})
		v.Cause = err
		return v
	}
	return unavailable(err)
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
	Notifications  []notify.View    `json:"notifications"`
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
	ns, err := notify.ForOrder(ctx, s.DB, id)
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
