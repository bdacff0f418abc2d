-- +goose Up

-- The payment as a saga of persisted steps (DESIGN.md, "v2: the payment as a
-- saga of persisted steps"; CONTRACT.md, "Payments against Stripe's real
-- semantics").

-- Order statuses (CONTRACT.md): pending_payment -> requires_action -> paid |
-- payment_failed; pending_payment -> payment_unknown -> paid |
-- payment_failed; requires_action -> canceled. Transitions only move forward:
-- every UPDATE names the statuses it may leave in its WHERE clause
-- (internal/checkout/store.go, transitionFrom).
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN (
    'pending_payment', 'requires_action', 'payment_unknown', 'paid', 'payment_failed', 'canceled'));

ALTER TABLE orders
    -- payment_intent_id (existing) is now set as soon as the PaymentIntent
    -- is created (or adopted after an indeterminate create), before it is
    -- confirmed; payment_status is Stripe's last known status of it.
    ADD COLUMN payment_next_action   jsonb,       -- Stripe's next_action, while requires_action
    ADD COLUMN payment_client_secret text,        -- the PaymentIntent's client_secret, while requires_action
    ADD COLUMN payment_failure_code  text,        -- card_declined | payment_rejected | payment_action_timeout
    ADD COLUMN payment_decline_code  text,        -- Stripe's decline_code (or error code) when declined
    ADD COLUMN requires_action_at    timestamptz, -- when the order entered requires_action (PAYMENT_ACTION_TIMEOUT)
    ADD COLUMN payment_unknown_since timestamptz, -- first unanswered or indeterminate step not yet reconciled
    ADD COLUMN payment_orphans_checked_at timestamptz; -- last search for PaymentIntents an indeterminate create left

-- payment_attempts is the saga's log: one row per attempt of one step,
-- written BEFORE the call to Stripe, completed after it. A reader can see the
-- whole history of a payment here. The Stripe Idempotency-Key of an attempt
-- is derived from (order_id, step, attempt) alone, never from a clock or a
-- random source, so a resumed saga resends exactly the key it sent before.
CREATE TABLE payment_attempts (
    id                bigserial   PRIMARY KEY,
    order_id          text        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    tenant_id         text        NOT NULL,
    step              text        NOT NULL,          -- create | confirm | cancel (later: refund:{id})
    attempt           integer     NOT NULL CHECK (attempt >= 1),
    idempotency_key   text        NOT NULL UNIQUE,   -- "{order_id}/{step}/{attempt}"
    payment_intent_id text,                          -- the PaymentIntent acted on (confirm, cancel)
    request_params    jsonb       NOT NULL,          -- what was sent, for the history and the resend
    -- NULL: sent (or about to be) and no final answer recorded; may be resent
    -- under the same key while Stripe still keeps it. succeeded: Stripe
    -- answered with the object. failed: a card error (402). rejected: another
    -- 4xx, final. indeterminate: a 500, stored by Stripe under the key: the
    -- key can never succeed again, reconcile before a new attempt.
    outcome           text        CHECK (outcome IN ('succeeded', 'failed', 'indeterminate', 'rejected')),
    stripe_object_id  text,                          -- the PaymentIntent Stripe returned
    stripe_status     text,                          -- its status
    error             text,                          -- the last error, for people
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    UNIQUE (order_id, step, attempt)
);
-- The reconciler looks for orders whose payment is in doubt or waits.
CREATE INDEX orders_payment_open ON orders (status, updated_at)
    WHERE status IN ('pending_payment', 'requires_action', 'payment_unknown');

-- +goose Down
DROP INDEX orders_payment_open;
DROP TABLE payment_attempts;
ALTER TABLE orders
    DROP COLUMN payment_next_action,
    DROP COLUMN payment_client_secret,
    DROP COLUMN payment_failure_code,
    DROP COLUMN payment_decline_code,
    DROP COLUMN requires_action_at,
    DROP COLUMN payment_unknown_since,
    DROP COLUMN payment_orphans_checked_at;
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('pending_payment', 'paid', 'payment_failed'));
