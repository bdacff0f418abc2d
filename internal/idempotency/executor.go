package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
)

// Command is a route's part of one idempotent command: what the route
// does, where Executor does what every route does the same way (claim the
// key, replay, 422, 409, resume, run, release the lease early on failure).
// A Command holds the state of one execution (the order, the refund), so
// each execution gets a new one.
type Command interface {
	// Start is the first phase of a new key, inside the claim's
	// transaction tx: it validates, writes the route's state and advances
	// c (Store.Advance) to the route's first recovery point; or it
	// finishes c (Store.Finish) and returns the stored response, which
	// ends the command (an order out of stock, a refund beyond what is
	// left). An error rolls the claim back: nothing is stored, and the
	// same key may be sent again (a validation error, a 404).
	Start(ctx context.Context, tx *gorm.DB, c *Claim) (*Response, error)
	// Resume loads, inside tx, what a key taken over at c.RecoveryPoint
	// goes on from (c.OrderID names the route's record). An error rolls
	// the takeover back.
	Resume(ctx context.Context, tx *gorm.DB, c *Claim) error
	// Run drives the command from c's recovery point to its final
	// response, which it stores with Store.Finish in the transaction of
	// its last writes (every write fenced by c: Store.Fence, Fence.Holds).
	// An error leaves the key unfinished at its recovery point, for a
	// retry or the completer to resume; ErrLeaseLost means another owner
	// has it.
	Run(ctx context.Context, c *Claim) (*Response, error)
}

// Commands maps each route (Scope.Route, e.g. "POST /v1/checkouts") to a
// function that returns a new Command for one of its keys: what
// Executor.Complete resumes a key of that route with.
type Commands map[string]func() Command

// Routes returns the routes of cs, sorted.
func (cs Commands) Routes() []string { return slices.Sorted(maps.Keys(cs)) }

// Merge returns the union of cs and more. A route in two of them is a
// wiring mistake: it panics.
func (cs Commands) Merge(more ...Commands) Commands {
	all := maps.Clone(cs)
	if all == nil {
		all = Commands{}
	}
	for _, m := range more {
		for route, cmd := range m {
			if _, dup := all[route]; dup {
				panic(fmt.Sprintf("idempotency: two commands for route %q", route))
			}
			all[route] = cmd
		}
	}
	return all
}

// Executor runs Commands against the key store: the one place where a
// key is claimed, replayed, refused (422, 409), resumed or run, and its
// lease released early after a failure. DB and Store are required;
// Logger may be nil.
type Executor struct {
	Store  *Store
	DB     *gorm.DB
	Logger *slog.Logger
}

func (e *Executor) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Logger
}

// Execute runs cmd under the key scope for a request with fingerprint,
// whose lease token is owner. In one transaction it claims the key
// (Store.Claim) and then, by what the key holds: a finished key is
// replayed (its stored response, replayed true), and cmd does nothing; a
// key of another fingerprint is ErrKeyReused (422); a key leased by a live
// owner is ErrKeyInUse (409); an expired lease is taken over and cmd
// resumes (Command.Resume); a new key starts (Command.Start), whose stored
// response, if it gives one, is the answer. After that transaction
// commits, cmd runs (Command.Run; see Continue).
//
// Errors are cmd's, the key store's (ErrKeyReused, ErrKeyInUse,
// ErrLeaseLost) or the database's, untranslated: the route maps them to
// its answer. None of them is stored under the key.
func (e *Executor) Execute(ctx context.Context, scope Scope, fingerprint, owner string, cmd Command) (resp *Response, replayed bool, err error) {
	var claim *Claim
	var final *Response
	err = e.claimTx(ctx, func(tx *gorm.DB) (*Claim, error) {
		c, err := e.Store.Claim(ctx, tx, scope, fingerprint, owner)
		if err != nil {
			return nil, err
		}
		claim = c
		switch {
		case c.Response != nil:
			return c, nil
		case c.TakenOver:
			return c, cmd.Resume(ctx, tx, c)
		}
		final, err = cmd.Start(ctx, tx, c)
		return c, err
	})
	switch {
	case err != nil:
		return nil, false, err
	case final != nil:
		return final, false, nil
	case claim.Response != nil:
		return claim.Response, true, nil
	case claim.TakenOver:
		e.logger().InfoContext(ctx, "resuming a key after an expired lease", "route", scope.Route,
			"recovery_point", claim.RecoveryPoint, "order_id", claim.OrderID)
	}
	resp, err = e.Continue(ctx, claim, cmd.Run)
	return resp, false, err
}

// claimTx runs claim, which claims a key inside tx and returns the claim
// (nil: nothing claimed), in one transaction. When claim succeeded but the
// commit failed, its outcome is unknown (the connection lost at commit, a
// failover): the claim, and with it this owner's lease, may have been
// committed. The lease is then ended at once (Store.ReleaseEarly, which
// changes nothing if the claim was not committed or another owner holds
// the key), so that the client's retry resumes the key instead of getting
// 409 idempotency_key_in_use for a whole IDEMPOTENCY_LEASE; the fast
// path's claim does the same (checkout.Service.Checkout). The error
// returned is the transaction's.
func (e *Executor) claimTx(ctx context.Context, claim func(tx *gorm.DB) (*Claim, error)) error {
	var committing *Claim
	err := postgres.WithTx(ctx, e.DB, func(tx *gorm.DB) error {
		c, err := claim(tx)
		if err == nil && c != nil && c.Response == nil {
			committing = c
		}
		return err
	})
	if err != nil && committing != nil {
		e.Store.ReleaseEarly(e.DB, committing, e.logger())
	}
	return err
}

// Continue runs run from c, a claim the caller holds (made by Execute, or
// by a route's own single-statement claim), and returns its response.
// When run fails for any reason but ErrLeaseLost, c's lease is ended at
// once (Store.ReleaseEarly), so that the client's retry resumes without
// waiting for it to expire.
func (e *Executor) Continue(ctx context.Context, c *Claim, run func(context.Context, *Claim) (*Response, error)) (*Response, error) {
	resp, err := run(ctx, c)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		e.Store.ReleaseEarly(e.DB, c, e.logger())
	}
	return resp, err
}

// Complete finishes the unfinished key keyID whose lease has expired,
// through the same Command a client's retry would run: in one
// transaction it takes the key over (Store.TakeOver, only for a route of
// commands; a key of another route is not touched) and resumes it with
// its route's Command, and then runs it while extending the lease every
// Store.Lease/3 (Store.KeepLease), as the gateway does for a request. It
// reports false when there was nothing to do (the key finished meanwhile,
// its lease is live, another process holds the row, another route). An
// error means the key is still unfinished and may be tried again. The
// completer and the reconciler call it, from any number of processes at
// once: every write after the takeover is fenced by the new lease.
func (e *Executor) Complete(ctx context.Context, keyID int64, commands Commands) (bool, error) {
	var (
		claim *Claim
		cmd   Command
	)
	err := e.claimTx(ctx, func(tx *gorm.DB) (*Claim, error) {
		c, err := e.Store.TakeOver(ctx, tx, keyID, NewOwnerToken(), commands.Routes()...)
		if err != nil || c == nil {
			return nil, err
		}
		claim, cmd = c, commands[c.Scope.Route]()
		return c, cmd.Resume(ctx, tx, c)
	})
	if err != nil || claim == nil {
		return false, err
	}
	stop := e.Store.KeepLease(ctx, e.DB, claim.Scope, claim.Owner, e.logger())
	defer stop()
	e.logger().InfoContext(ctx, "completing an unfinished key after an expired lease", "route", claim.Scope.Route,
		"recovery_point", claim.RecoveryPoint, "order_id", claim.OrderID, "key_hash", claim.Scope.Hash()[:16])
	if _, err := e.Continue(ctx, claim, cmd.Run); err != nil {
		return false, err
	}
	return true, nil
}

// Resumer completes the expired keys of its Commands' routes through
// Executor.Complete: the one resume path for every keyed route, whatever
// process runs it. A key of a route not in Commands is never taken over
// (false, nil). It is the completer's KeyCompleter (internal/sweep).
type Resumer struct {
	Executor *Executor
	Commands Commands
}

// Complete is Executor.Complete of keyID with r.Commands.
func (r *Resumer) Complete(ctx context.Context, keyID int64) (bool, error) {
	return r.Executor.Complete(ctx, keyID, r.Commands)
}
