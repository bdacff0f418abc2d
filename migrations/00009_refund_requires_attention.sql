-- +goose Up

-- A refund whose create Stripe left indeterminate (a stored 500, an attempt
-- unanswered past the key's retention) and that is still not found at
-- Stripe after REFUND_RETRY_AFTER is parked in requires_attention rather
-- than sent again under a new key: a refund cannot be canceled, so a late
-- roll-forward of the first attempt would refund the customer twice. Its
-- amount stays reserved, it is counted and alerted on, and the refund
-- reconciler keeps listing the PaymentIntent's refunds for it.
--
-- The column's CHECK (named by PostgreSQL after table and column) gets the
-- new status; the table is small next to orders, and the check is
-- validated under the ALTER's lock, as 00004 did for orders.
ALTER TABLE refunds DROP CONSTRAINT IF EXISTS refunds_status_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_status_check
    CHECK (status IN ('pending', 'succeeded', 'failed', 'requires_attention'));

-- The reconciler and the gauge read the parked refunds, which are few: a
-- partial index holds only them.
CREATE INDEX IF NOT EXISTS refunds_requires_attention ON refunds (updated_at) WHERE status = 'requires_attention';

-- +goose Down
DROP INDEX IF EXISTS refunds_requires_attention;
-- The older code knows no parked refund: they show as pending again, their
-- amount still reserved, for an operator to settle against Stripe.
UPDATE refunds SET status = 'pending' WHERE status = 'requires_attention';
ALTER TABLE refunds DROP CONSTRAINT IF EXISTS refunds_status_check;
ALTER TABLE refunds ADD CONSTRAINT refunds_status_check CHECK (status IN ('pending', 'succeeded', 'failed'));
