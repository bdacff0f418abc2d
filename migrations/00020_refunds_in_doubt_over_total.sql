-- +goose Up

-- Money Stripe says moved is the truth (CONTRACT.md v4, "Changes made
-- outside the service"): a refund made in the Dashboard is adopted when it
-- fits in what the order paid less what Stripe has refunded, whatever the
-- reservations of our refunds still in doubt (pending without an answer,
-- requires_attention) say. refund_reserved, which counts those too, may
-- then exceed amount_total until Stripe refuses them (they fail and give
-- their reservation back). What the schema keeps: succeeded refunds never
-- exceed what the order paid. New API refunds are still refused beyond
-- amount_total - refund_reserved, under the order's row lock.
-- NOT VALID, then VALIDATE: the scan holds no lock that blocks writes.
ALTER TABLE orders DROP CONSTRAINT orders_refunds_within_total;
ALTER TABLE orders ADD CONSTRAINT orders_refunds_within_total
    CHECK (amount_refunded >= 0 AND amount_refunded <= refund_reserved AND amount_refunded <= amount_total) NOT VALID;
ALTER TABLE orders VALIDATE CONSTRAINT orders_refunds_within_total;

-- +goose Down
ALTER TABLE orders DROP CONSTRAINT orders_refunds_within_total;
ALTER TABLE orders ADD CONSTRAINT orders_refunds_within_total
    CHECK (amount_refunded >= 0 AND amount_refunded <= refund_reserved AND refund_reserved <= amount_total) NOT VALID;
