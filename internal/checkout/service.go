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
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/tracing"
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
	// counted and logged. internal/api.StrayRefunds adapts
	// *payments.Client to it.
	StrayRefunds RefundAPI

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
	switch first, err := s.beginFastPath(ctx, cmd); {
	case err != nil:
		// The claim's statement may have committed though its answer was
		// lost (a failover at commit): end the lease this request may hold,
		// by scope and owner, so the retry resumes the key at once rather
		// than a whole IDEMPOTENCY_LEASE later. Nothing matches otherwise.
		s.Keys.ReleaseEarly(s.DB, &idempotency.Claim{
			Scope: idempotency.Scope{Tenant: cmd.Tenant, Route: Route, Key: cmd.IdempotencyKey}, Owner: cmd.Owner}, s.Logger)
		return nil, false, s.translate(err)
	case first != nil:
		resp, err = s.executor().Continue(ctx, first.claim, func(ctx context.Context, c *idempotency.Claim) (*idempotency.Response, error) {
			return s.newRun(c, Route, first.order).payFastPath(ctx, first.create)
		})
		return resp, false, err
	}
	// Not a first execution (the key exists, or the body is wrong): the
	// general path, which reads what is stored and applies the contract's
	// rules in its order.
	scope := idempotency.Scope{Tenant: cmd.Tenant, Route: Route, Key: cmd.IdempotencyKey}
	resp, replayed, err = s.executor().Execute(ctx, scope, cmd.Fingerprint, cmd.Owner,
		&checkoutCommand{s: s, in: cmd.Input, inputErrs: cmd.InputErrors})
	if err != nil {
		return nil, false, s.translate(err)
	}
	return resp, replayed, nil
}

// checkoutCommand is one execution of a checkout (Route) on the general
// path, as an idempotency.Command.
type checkoutCommand struct {
	s *Service
	// in and inputErrs are a new key's decoded body and what decoding
	// found wrong with it.
	in        *Request
	inputErrs []FieldError
	// order is the order, as Start or Resume loaded it.
	order *orders.Order
}

// Start is createOrder.
func (x *checkoutCommand) Start(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (final *idempotency.Response, err error) {
	in := x.in
	if in == nil {
		in = &Request{}
	}
	x.order, final, err = x.s.createOrder(ctx, tx, c, in, x.inputErrs)
	return final, err
}

// Resume loads the order of a key taken over at order_created, and links
// the span of whoever resumes it (the completer, a client's retry) to the
// order's checkout trace.
func (x *checkoutCommand) Resume(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (err error) {
	x.order, err = x.s.resumedOrder(ctx, tx, c)
	if err == nil {
		tp, terr := outbox.TraceParentOf(ctx, tx, c.OrderID)
		if terr != nil {
			return terr
		}
		tracing.LinkTo(ctx, tp)
	}
	return err
}

// Run is the payment saga (run.pay).
func (x *checkoutCommand) Run(ctx context.Context, c *idempotency.Claim) (*idempotency.Response, error) {
	return x.s.newRun(c, Route, x.order).pay(ctx)
}

// executor runs the package's commands against Keys.
func (s *Service) executor() *idempotency.Executor {
	return &idempotency.Executor{Store: s.Keys, DB: s.DB, Logger: s.Logger}
}

// Commands are the package's routes that take an Idempotency-Key, each
// with the command that resumes its keys: the checkout (Route) and the
// cancellation (CancelRoute). Every process that completes keys hands
// them to its completer (internal/api.Completer).
func (s *Service) Commands() idempotency.Commands {
	return idempotency.Commands{
		Route:       func() idempotency.Command { return &checkoutCommand{s: s} },
		CancelRoute: func() idempotency.Command { return &cancellation{s: s} },
	}
}

// Complete finishes the unfinished key id of a checkout or a cancellation
// whose lease has expired, through the same saga a client's retry would
// run, with the same Stripe keys (idempotency.Executor.Complete with
// Commands). Keys of other routes are not touched. It reports false when
// there was nothing to do. The completer and the reconciler call it.
func (s *Service) Complete(ctx context.Context, keyID int64) (bool, error) {
	return s.executor().Complete(ctx, keyID, s.Commands())
}

// createOrder is transaction 1 after a new claim: validate, then phase 1
// (queueOrderCreated: the stock, the order, its order.created event) sent
// on the claim's transaction, and the recovery point advanced. When stock is short it finishes the key with a stored 409 instead
// and returns that as final.
func (s *Service) createOrder(ctx context.Context, tx *gorm.DB, c *idempotency.Claim, in *Request, inputErrs []FieldError) (*orders.Order, *idempotency.Response, error) {
	// Any error returned from here rolls the claim back: nothing is stored,
	// and the same key can be sent again with a corrected body.
	errs := in.validate(inputErrs)
	want, skus := in.wanted()
	products, err := loadProducts(ctx, tx, skus)
	if err != nil {
		return nil, nil, err
	}
	if errs = append(errs, in.unknownSKUs(products)...); len(errs) > 0 {
		return nil, nil, problem.Validation(errs)
	}
	if errs = in.mixedCurrencies(products); len(errs) > 0 {
		return nil, nil, problem.Validation(errs)
	}
	o := s.newOrder(c.Scope.Tenant, in, products)
	// Phase 1's batch on the claim's transaction, behind a savepoint: out
	// of stock fails it at a guard, and leaves nothing to write but the
	// key's stored 409. This path is rare (the fast path makes almost every
	// order), so it takes a round trip a statement.
	if err := tx.SavePoint(savepointOrderCreated).Error; err != nil {
		return nil, nil, fmt.Errorf("savepoint: %w", err)
	}
	var b postgres.Batch
	if err := s.queueOrderCreated(ctx, &b, o, want, products); err != nil {
		return nil, nil, err
	}
	err = postgres.Send(ctx, tx, &b)
	if postgres.IsGuard(err, guardOutOfStock) {
		if err := tx.RollbackTo(savepointOrderCreated).Error; err != nil {
			return nil, nil, fmt.Errorf("rollback to savepoint: %w", err)
		}
		resp := responseForError(ErrOutOfStock)
		if err := s.Keys.Finish(ctx, tx, c, resp); err != nil {
			return nil, nil, err
		}
		return nil, resp, nil
	}
	if err != nil {
		// guardCatalogChanged too: a price changed since loadProducts read
		// it, in this transaction; the retry reads it again.
		return nil, nil, fmt.Errorf("insert order: %w", err)
	}
	if err := s.Keys.Advance(ctx, tx, c, RecoveryPointOrderCreated, o.ID); err != nil {
		return nil, nil, err
	}
	return o, nil, nil
}

// savepointOrderCreated is the savepoint createOrder rolls back to when
// the stock is short.
const savepointOrderCreated = "order_created"

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
			errs = append(errs, FieldError{Field: fmt.Sprintf("items[%d].sku", i), Message: fmt.Sprintf("unknown sku %q", it.SKU)})
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
			errs = append(errs, FieldError{Field: fmt.Sprintf("items[%d].sku", i), Message: "all items must have the same currency"})
		}
	}
	return errs
}

// newOrder returns tenant's new order for in (valid, every sku in
// products), pending payment, created now, with a new id.
func (s *Service) newOrder(tenant string, in *Request, products map[string]Product) *orders.Order {
	o := &orders.Order{
		ID:            ids.New("ord"),
		Status:        orders.PendingPayment,
		Email:         in.Email,
		Currency:      products[in.Items[0].SKU].Currency,
		Payment:       orders.Payment{Provider: "stripe"},
		CreatedAt:     s.Now().UTC().Truncate(time.Microsecond),
		TenantID:      tenant,
		PaymentMethod: in.PaymentMethod,
		ReturnURL:     in.ReturnURL,
	}
	for _, it := range in.Items {
		p := products[it.SKU]
		amount := p.UnitAmount * int64(it.Quantity)
		o.Items = append(o.Items, orders.OrderItem{SKU: it.SKU, Quantity: it.Quantity, UnitAmount: p.UnitAmount, Amount: amount})
		o.AmountTotal += amount
	}
	return o
}

// resumedOrder loads the order of a key taken over at its recovery point.
func (s *Service) resumedOrder(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (*orders.Order, error) {
	want := RecoveryPointOrderCreated
	if c.Scope.Route == CancelRoute {
		want = RecoveryPointCancelRequested
	}
	if c.RecoveryPoint != want || c.OrderID == "" {
		return nil, fmt.Errorf("key %d: cannot resume at recovery point %q", c.ID, c.RecoveryPoint)
	}
	return loadOrder(ctx, tx, c.Scope.Tenant, c.OrderID)
}

func (s *Service) event(typ string, o *orders.Order, at time.Time) outbox.Event {
	return orders.Event(typ, o, at)
}

// translate keeps domain errors and the idempotency layer's problems as
// they are, turns a data exception (SQLSTATE class 22, e.g. a NUL byte in a
// string that validation did not catch: a retry would fail the same way)
// into a validation_error, and anything else (the database failing, a
// deadline) into unavailable, wrapping the cause for the log.
func (s *Service) translate(err error) error {
	var p *problem.Error
	switch {
	case errors.As(err, &p):
		return err
	case postgres.IsDataException(err):
		return problem.Wrap(problem.Validation([]FieldError{{Field: "", Message: "contains characters that cannot be stored"}}), err)
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

// Order returns tenant's order id, or ErrOrderNotFound. The GET order view
// that joins its refunds and notifications is internal/api's.
func (s *Service) Order(ctx context.Context, tenantID, id string) (*orders.Order, error) {
	if !ids.Valid("ord", id) {
		return nil, ErrOrderNotFound // not even shaped like an id: no query
	}
	o, err := loadOrder(ctx, s.DB, tenantID, id)
	if err != nil {
		return nil, s.translate(err)
	}
	return o, nil
}
