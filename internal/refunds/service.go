package refunds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/stripestep"
)

// Coded errors that are not stored under the key.
var (
	ErrOrderNotFound = problem.New(problem.CodeNotFound, "No such order.")
	// ErrPaymentUnavailable: Stripe did not answer, or its answer was
	// indeterminate and reconciliation has not settled it yet.
	ErrPaymentUnavailable = problem.New(problem.CodePaymentProviderUnavailable,
		"The payment provider did not answer. Retry with the same Idempotency-Key: it resumes this refund and never refunds twice.")
	// ErrProviderCredentials: Stripe refused this service's own
	// credentials (401, 403), which is not the refund being refused
	// (CONTRACT.md v3): payment_provider_unavailable with 503.
	ErrProviderCredentials = problem.New(problem.CodePaymentProviderCredentials,
		"The payment provider refused this service's credentials, so this refund is not settled yet. Retry with the same Idempotency-Key once the service is fixed: it resumes this refund and never refunds twice.")
	ErrUnavailable = problem.New(problem.CodeUnavailable,
		"A dependency is unavailable. Retry with the same Idempotency-Key: it resumes this refund and never refunds twice.")
)

// DefaultRetryAfter is Service.RetryAfter's default: 24 hours, the time
// Stripe keeps an idempotency key's stored answer at least.
const DefaultRetryAfter = 24 * time.Hour

// Service runs refunds. DB, Keys and Stripe are required.
type Service struct {
	DB     *gorm.DB
	Keys   *idempotency.Store
	Stripe Stripe
	Logger *slog.Logger
	// Now is the clock (the one Keys uses); nil means time.Now.
	Now func() time.Time
	// RetryAfter is how long after an indeterminate attempt (a stored 500,
	// an attempt unanswered past stripestep.ResendWindow) the request keeps
	// reconciling before the refund is parked requires_attention (default
	// 24h, the time Stripe keeps the key's stored answer at least,
	// https://docs.stripe.com/api/idempotent_requests). Until then the
	// refund stays pending (its amount held against what is left to
	// refund), the request answers 502, and its retry or the completer
	// reconciles again; after it the key is finished with 201 and the
	// refund requires_attention. It is never sent under a new key: Stripe
	// may roll an indeterminate request forward later
	// (https://docs.stripe.com/error-low-level#server-errors), and a refund,
	// unlike an orphan PaymentIntent, cannot be canceled, so a second
	// attempt would be a second refund.
	RetryAfter time.Duration
	// Metrics counts reconciliations and duplicates (nil: nothing).
	Metrics *Metrics
	// OutsideLookback is how far back AdoptOutside's first round looks for
	// refunds made outside the service (default DefaultOutsideLookback).
	OutsideLookback time.Duration

	// outsideSince is where AdoptOutside's next round starts (zero: not
	// run yet); outsideMu serializes its rounds.
	outsideMu    sync.Mutex
	outsideSince time.Time
}

func (s *Service) now() time.Time {
	if s.Now == nil {
		return time.Now().UTC().Truncate(time.Microsecond)
	}
	return s.Now().UTC().Truncate(time.Microsecond)
}

// unsettled is the error for refund refundID, which Stripe has not settled
// because of err, a call that got no usable answer: ErrProviderCredentials
// when Stripe refused this service's own credentials (logged as an error: a
// person must fix STRIPE_SECRET_KEY), ErrPaymentUnavailable otherwise.
// Neither is stored under the key.
func (s *Service) unsettled(ctx context.Context, refundID string, err error) error {
	if errors.Is(err, stripestep.ErrCredentials) {
		s.Logger.ErrorContext(ctx, "Stripe refused the service's credentials (401/403): check STRIPE_SECRET_KEY",
			"refund_id", refundID, "err", err)
		return problem.Wrap(ErrProviderCredentials, err)
	}
	return problem.Wrap(ErrPaymentUnavailable, err)
}

func (s *Service) retryAfter() time.Duration {
	if s.RetryAfter <= 0 {
		return DefaultRetryAfter
	}
	return s.RetryAfter
}

// Refund executes, resumes or replays the refund of orderID that req
// identifies. in is the decoded body and inputErrs what decoding found
// wrong with it, reported only after the stored-key rules.
//
// It returns the final response, stored under the key (201 with the
// refund, 409 order_not_refundable, 409 refund_exceeds_payment), and
// whether it is a replay. Errors are problems that are not stored: 422
// idempotency_key_reused, 409 idempotency_key_in_use, 400
// validation_error, 404 not_found, 502 payment_provider_unavailable and
// 503 unavailable (the key keeps its recovery point; a retry resumes it).
func (s *Service) Refund(ctx context.Context, req *idempotency.Request, orderID string, in *Request, inputErrs []FieldError) (*idempotency.Response, bool, error) {
	resp, replayed, err := s.executor().Execute(ctx, req.Scope, req.Fingerprint, req.Owner,
		&refundCommand{s: s, orderID: orderID, in: in, inputErrs: inputErrs})
	if err != nil {
		return nil, false, translate(err)
	}
	return resp, replayed, nil
}

// refundCommand is one execution of a refund (Route) as an
// idempotency.Command.
type refundCommand struct {
	s *Service
	// orderID, in and inputErrs are a new key's order, decoded body and
	// what decoding found wrong with it.
	orderID   string
	in        *Request
	inputErrs []FieldError
	// refund is the refund, as Start or Resume loaded it.
	refund *refundRow
}

// Start is create.
func (x *refundCommand) Start(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (final *idempotency.Response, err error) {
	x.refund, final, err = x.s.create(ctx, tx, c, x.orderID, x.in, x.inputErrs)
	return final, err
}

// Resume loads the refund of a key taken over at refund_created.
func (x *refundCommand) Resume(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (err error) {
	x.refund, err = refundOfKey(ctx, tx, c.ID)
	return err
}

// Run is run.
func (x *refundCommand) Run(ctx context.Context, c *idempotency.Claim) (*idempotency.Response, error) {
	return x.s.run(ctx, c, x.refund)
}

// executor runs the package's command against Keys.
func (s *Service) executor() *idempotency.Executor {
	return &idempotency.Executor{Store: s.Keys, DB: s.DB, Logger: s.Logger}
}

// Commands is the package's one route that takes an Idempotency-Key,
// Route, with the command that resumes its keys: what every process that
// completes keys hands its completer (internal/api.Completer).
func (s *Service) Commands() idempotency.Commands {
	return idempotency.Commands{Route: func() idempotency.Command { return &refundCommand{s: s} }}
}

// create is transaction 1 after a new claim: validate, lock the order,
// check what is left to refund, insert the pending refund with its
// reservation and its first attempt, advance the key. An order that cannot
// be refunded, or an amount beyond what is left, finishes the key with the
// stored 409 instead.
func (s *Service) create(ctx context.Context, tx *gorm.DB, c *idempotency.Claim, orderID string, in *Request, inputErrs []FieldError) (*refundRow, *idempotency.Response, error) {
	if errs := in.validate(inputErrs); len(errs) > 0 {
		return nil, nil, ValidationError(errs) // rolls the claim back: not stored
	}
	if !ids.Valid("ord", orderID) {
		return nil, nil, ErrOrderNotFound
	}
	o, err := lockOrder(ctx, tx, c.Scope.Tenant, orderID)
	if err != nil {
		return nil, nil, err
	}
	finish := func(e *problem.Error) (*refundRow, *idempotency.Response, error) {
		resp := idempotency.ProblemResponse(e.With("order_id", o.ID))
		if err := s.Keys.Finish(ctx, tx, c, resp); err != nil {
			return nil, nil, err
		}
		return nil, resp, nil
	}
	left := o.AmountTotal - o.RefundReserved
	// A refunded order has something left only when Stripe failed a refund
	// after it had succeeded: its amount is again available (CONTRACT.md),
	// though the status never moves back.
	refundable := o.Status.Refundable() || (o.Status == orders.Refunded && left > 0)
	if !refundable || o.PaymentIntentID == nil {
		return finish(ErrOrderNotRefundable)
	}
	amount := left
	if in.Amount != nil {
		amount = *in.Amount
	}
	if amount <= 0 || amount > left {
		return finish(ErrRefundExceedsPayment.With("amount_refundable", left))
	}

	now := s.now()
	r := &refundRow{
		ID: ids.New("rf"), OrderID: o.ID, TenantID: o.TenantID, IdempotencyKeyID: &c.ID,
		Amount: amount, Currency: o.Currency, Status: StatusPending, PaymentIntentID: *o.PaymentIntentID,
		CreatedAt: now, UpdatedAt: now,
	}
	if in.Reason != "" {
		r.Reason = &in.Reason
	}
	if err := tx.WithContext(ctx).Create(r).Error; err != nil {
		return nil, nil, fmt.Errorf("insert refund: %w", err)
	}
	// The order row is locked, so no other refund reserves in between; the
	// CHECK (refund_reserved <= amount_total) backs this in the schema.
	if err := orders.Reserve(ctx, tx, o.ID, amount, now); err != nil {
		return nil, nil, err
	}
	if _, err := insertAttempt(ctx, tx, r, 1, now); err != nil {
		return nil, nil, err
	}
	if err := s.Keys.Advance(ctx, tx, c, RecoveryPointRefundCreated, o.ID); err != nil {
		return nil, nil, err
	}
	return r, nil, nil
}

// run is the Stripe step and transaction 2, from wherever the refund's
// step log stands: an attempt not yet answered is sent (again) under its
// own key; an indeterminate one is reconciled by listing the
// PaymentIntent's refunds, and after RetryAfter without a match the
// refund is parked requires_attention, never sent under a new key; a
// rejected one fails the refund. Transaction 2 applies Stripe's refund (or
// parks it) and finishes the key with 201.
func (s *Service) run(ctx context.Context, c *idempotency.Claim, r *refundRow) (*idempotency.Response, error) {
	for range 2 { // at most: an attempt past stripestep.ResendWindow marked indeterminate, then reconciled
		a, err := latestAttempt(ctx, s.DB, r)
		if err != nil {
			return nil, translate(err)
		}
		switch {
		case a == nil:
			return nil, translate(fmt.Errorf("refund %s has no attempt", r.ID))
		case a.Outcome == stripestep.Open && !a.Resendable(s.now()):
			// Stripe may have pruned the key (it keeps keys at least 24
			// hours): resending it could run the refund a second time.
			if rerr := recordAttempt(ctx, s.DB, a, stripestep.Indeterminate, nil,
				fmt.Errorf("unanswered for %s: reconcile instead of resending the key", stripestep.ResendWindow), s.now()); rerr != nil {
				return nil, translate(rerr)
			}
		case a.Outcome == stripestep.Open:
			st, err := s.Stripe.CreateRefund(ctx, CreateParams{
				IdempotencyKey: a.IdempotencyKey, PaymentIntentID: r.PaymentIntentID, Amount: r.Amount,
				Reason: deref(r.Reason), RefundID: r.ID, OrderID: r.OrderID, TenantID: r.TenantID,
			})
			switch outcome := stripestep.OutcomeOf(err); outcome {
			case stripestep.Succeeded:
				if rerr := recordAttempt(ctx, s.DB, a, outcome, &st, nil, s.now()); rerr != nil {
					s.Logger.WarnContext(ctx, "record refund attempt", "err", rerr)
				}
				return s.settle(ctx, c, r, &st, "")
			case stripestep.Failed, stripestep.Rejected:
				if rerr := recordAttempt(ctx, s.DB, a, outcome, nil, err, s.now()); rerr != nil {
					return nil, translate(rerr)
				}
				return s.settle(ctx, c, r, nil, "stripe_rejected")
			case stripestep.Indeterminate:
				s.Logger.WarnContext(ctx, "refund attempt indeterminate; reconciling before any new attempt",
					"refund_id", r.ID, "attempt", a.Attempt, "err", err)
				if rerr := recordAttempt(ctx, s.DB, a, outcome, nil, err, s.now()); rerr != nil {
					return nil, translate(rerr)
				}
				// The next round reconciles at once: with a roll-forward
				// of "0s" the refund is already there.
			default:
				// No answer (or our credentials refused): Stripe stored
				// nothing we know of under the key, so the attempt stays
				// open and the retry (or the completer) resends the same
				// key, which runs the request or replays what it did.
				if rerr := recordAttempt(ctx, s.DB, a, stripestep.Open, nil, err, s.now()); rerr != nil {
					s.Logger.WarnContext(ctx, "record refund attempt", "err", rerr)
				}
				return nil, translate(s.unsettled(ctx, r.ID, err))
			}
		case a.Outcome == stripestep.Succeeded && a.StripeObjectID != nil:
			// Stripe answered but transaction 2 did not commit.
			st, err := s.Stripe.GetRefund(ctx, *a.StripeObjectID)
			if err != nil {
				return nil, translate(s.unsettled(ctx, r.ID, err))
			}
			return s.settle(ctx, c, r, &st, "")
		case a.Outcome.Refused():
			return s.settle(ctx, c, r, nil, "stripe_rejected")
		default: // indeterminate
			found, err := s.reconcile(ctx, r)
			if err != nil {
				return nil, translate(s.unsettled(ctx, r.ID, err))
			}
			if found != nil {
				s.Metrics.reconciled(ReconcileFound)
				s.Logger.InfoContext(ctx, "refund reconciled: Stripe has it", "refund_id", r.ID, "stripe_refund_id", found.ID)
				if rerr := recordAttempt(ctx, s.DB, a, stripestep.Succeeded, found, nil, s.now()); rerr != nil {
					s.Logger.WarnContext(ctx, "record refund attempt", "err", rerr)
				}
				return s.settle(ctx, c, r, found, "")
			}
			if age := s.now().Sub(a.UpdatedAt); age < s.retryAfter() {
				s.Metrics.reconciled(ReconcileNotYet)
				return nil, translate(problem.Wrap(ErrPaymentUnavailable,
					fmt.Errorf("refund %s attempt %d indeterminate %s ago and not at Stripe yet; parked after %s",
						r.ID, a.Attempt, age.Round(time.Millisecond), s.retryAfter())))
			}
			s.Metrics.reconciled(ReconcileParked)
			s.Logger.ErrorContext(ctx, "refund not at Stripe after the reconciliation window; parked requires_attention, never resent",
				"refund_id", r.ID, "order_id", r.OrderID, "attempt", a.Attempt, "idempotency_key", a.IdempotencyKey)
			return s.settle(ctx, c, r, nil, "")
		}
	}
	return nil, translate(problem.Wrap(ErrPaymentUnavailable, fmt.Errorf("refund %s: no final answer yet", r.ID)))
}

// reconcile lists the PaymentIntent's refunds and returns the one carrying
// metadata[refund_id] = r.ID, or nil. More than one is a duplicate made by
// a roll-forward: logged; the first non-failed one is adopted.
func (s *Service) reconcile(ctx context.Context, r *refundRow) (*StripeRefund, error) {
	all, err := s.Stripe.ListRefunds(ctx, r.PaymentIntentID)
	if err != nil {
		return nil, err
	}
	var ours []StripeRefund
	for _, st := range all {
		if st.Metadata["refund_id"] == r.ID {
			ours = append(ours, st)
		}
	}
	if len(ours) == 0 {
		return nil, nil
	}
	if len(ours) > 1 {
		s.Metrics.duplicate(len(ours) - 1)
		s.Logger.ErrorContext(ctx, "Stripe holds more than one refund for one of ours", "refund_id", r.ID, "count", len(ours))
	}
	slices.SortStableFunc(ours, func(a, b StripeRefund) int {
		return boolInt(ourStatus(a.Status) == StatusFailed) - boolInt(ourStatus(b.Status) == StatusFailed)
	})
	return &ours[0], nil
}

// settle is transaction 2: fenced by the key, it applies Stripe's refund
// st (or, with st nil, fails the refund for failureReason, or parks it
// requires_attention when failureReason is empty), and finishes the key
// with 201 and the refund as it now stands.
func (s *Service) settle(ctx context.Context, c *idempotency.Claim, r *refundRow, st *StripeRefund, failureReason string) (*idempotency.Response, error) {
	var resp *idempotency.Response
	now := s.now()
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		// The fence first: it locks the key row, so a takeover meanwhile
		// stops us before any other write.
		if err := s.Keys.Fence(ctx, tx, c); err != nil {
			return err
		}
		if st != nil {
			// Bind Stripe's id first, so Apply finds the refund by it
			// whatever metadata Stripe echoes; the order row first, as
			// every writer of refunds locks them (order, then refund).
			if _, err := lockOrder(ctx, tx, "", r.OrderID); err != nil {
				return err
			}
			if err := tx.WithContext(ctx).Exec(`UPDATE refunds SET stripe_refund_id = ? WHERE id = ? AND stripe_refund_id IS NULL`,
				st.ID, r.ID).Error; err != nil {
				return fmt.Errorf("bind refund %s to %s: %w", r.ID, st.ID, err)
			}
			// A second Stripe refund for this one (a 500 rolled forward
			// after another attempt was adopted) changes nothing here:
			// logged and counted, and the key is finished with the refund
			// as it stands.
			if _, err := s.ApplyRefund(ctx, tx, *st); err != nil && !errors.Is(err, ErrDuplicateAtStripe) {
				return err
			}
		} else if failureReason == "" {
			if err := park(ctx, tx, r, now); err != nil {
				return err
			}
		} else if err := failUnsent(ctx, tx, r, failureReason, now); err != nil {
			return err
		}
		cur, err := loadRefund(ctx, tx, r.ID, false)
		if err != nil {
			return err
		}
		body, err := json.Marshal(cur.view())
		if err != nil {
			return err
		}
		resp = idempotency.JSONResponse(http.StatusCreated, body, "")
		return s.Keys.Finish(ctx, tx, c, resp)
	})
	if err != nil {
		return nil, translate(err)
	}
	return resp, nil
}

// park moves a pending refund that Stripe does not show after RetryAfter
// to requires_attention; its amount stays reserved.
func park(ctx context.Context, tx *gorm.DB, r *refundRow, now time.Time) error {
	if _, err := lockOrder(ctx, tx, "", r.OrderID); err != nil {
		return err
	}
	if err := tx.WithContext(ctx).Model(&refundRow{}).Where("id = ? AND status = ?", r.ID, StatusPending).
		Updates(map[string]any{"status": StatusRequiresAttention, "updated_at": now}).Error; err != nil {
		return fmt.Errorf("park refund %s: %w", r.ID, err)
	}
	return nil
}

// failUnsent fails a refund Stripe refused to create: no Stripe id, its
// reservation released.
func failUnsent(ctx context.Context, tx *gorm.DB, r *refundRow, reason string, now time.Time) error {
	if _, err := lockOrder(ctx, tx, "", r.OrderID); err != nil {
		return err
	}
	cur, err := loadRefund(ctx, tx, r.ID, true)
	if err != nil || cur.Status != StatusPending {
		return err
	}
	if err := tx.WithContext(ctx).Model(&refundRow{}).Where("id = ?", r.ID).Updates(map[string]any{
		"status": StatusFailed, "failure_reason": reason, "settled_at": now, "updated_at": now,
	}).Error; err != nil {
		return fmt.Errorf("fail refund %s: %w", r.ID, err)
	}
	return orders.Reserve(ctx, tx, r.OrderID, -r.Amount, now)
}

// translate keeps coded errors, and turns anything else (the database
// failing, a deadline) into 503 unavailable, wrapping the cause for the log.
func translate(err error) error {
	var e *problem.Error
	if errors.As(err, &e) {
		return err
	}
	return problem.Wrap(ErrUnavailable, err)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
