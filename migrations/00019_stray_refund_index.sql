-- +goose NO TRANSACTION
-- +goose Up

-- The refunds of stray payments (CONTRACT.md v3/v4: a PaymentIntent that
-- moved money for an order that is not paid) are steps of the log,
-- 'stray-refund:{pi id}', one attempt per refund Stripe failed. The
-- reconciler reads the latest attempt of each every round, to send the
-- refund again until Stripe says it succeeded and to count the money not
-- returned. There should be none: this index holds only them, so the
-- round reads nothing else of payment_attempts. Its columns and predicate
-- never change after the insert (HOT updates stay possible, see 00007);
-- CONCURRENTLY, and dropped first for a failed build, as 00007 explains.
DROP INDEX CONCURRENTLY IF EXISTS payment_attempts_stray_refunds;
CREATE INDEX CONCURRENTLY payment_attempts_stray_refunds
    ON payment_attempts (order_id, step, attempt) WHERE step LIKE 'stray-refund:%';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payment_attempts_stray_refunds;
