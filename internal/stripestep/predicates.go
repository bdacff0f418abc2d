package stripestep

// Conditions over the step log for the sweep's queries over orders
// (internal/sweep): they read payment_attempts through these, never by
// naming it.

// RecreatedOrders returns an SQL subquery that yields the id of every
// order with a create attempt after its first, written after the
// subquery's one argument (a time). Only such an order can have an orphan
// PaymentIntent: Stripe creates at most one object per key, and a create
// goes out under a new key only after the one before was answered
// indeterminately or not at all. It reads the partial index
// payment_attempts_recreated (migration 00007), whose predicate it spells
// literally (no parameter) so that the planner can use it. Use it as
// "o.id IN (" + RecreatedOrders() + ")".
func RecreatedOrders() string {
	return `SELECT a.order_id FROM payment_attempts a
	               WHERE a.step = '` + StepCreate + `' AND a.attempt > 1 AND a.created_at > ?`
}

// PaymentIndeterminate returns an SQL condition, without arguments, true
// when the latest attempt (by when it was last written or answered) of the
// PaymentIntent steps (create, confirm) of the order whose id is the SQL
// expression orderID (e.g. "o.id") is Indeterminate: its payment must be
// reconciled with Stripe before anything is sent again.
func PaymentIndeterminate(orderID string) string {
	return `(SELECT a.outcome FROM payment_attempts a
		      WHERE a.order_id = ` + orderID + ` AND a.step IN ('` + StepCreate + `', '` + StepConfirm + `')
		      ORDER BY a.updated_at DESC, a.id DESC LIMIT 1) = '` + string(Indeterminate) + `'`
}
